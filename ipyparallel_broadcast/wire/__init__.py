"""The wire: what every process of the cluster shares.

Message framing and signing (``protocol``), coalesced reply bundles
(``bundles``), ids (``naming``), the tree's shape (``topology``), reduce
operators (``reduction``), zmq frame helpers (``frames``) and log levels
(``logs``). Runs in every process; imports nothing else of this package.
"""
