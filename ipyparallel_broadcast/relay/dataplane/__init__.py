"""The data plane: big values between hosts, in chunks, both ways.

``chunks`` (chunk arithmetic, cutting into parts, assembly, the message
check) and ``model`` (the alpha-beta model) serve every transport: a push
down a tree of hosts (``push``), a reduce's values up a chain or two trees
(``chains`` links, ``reduce_trees`` picks the way), an allreduce round a
ring (``ring``). Sans I/O; it imports nothing of the relay node but its
``Send`` (``relay.events``).
"""
