"""Relay processes: the nodes of the tree and the host relays.

A pure core takes frames and events in and gives sends out (``node``, with
``events`` parsed once); it holds its parts as fields, each given a
``context`` and owning its state: ``down`` and ``up`` (a request's flow),
``inflight``, ``routes``, ``children``, ``surveys``, ``sharing``, ``stock``,
``heartbeat``, every timer in ``deadlines``, and the big-data parts
(``bigdata``: ``reduce_chains``, ``reduce_rings``, ``hostfold``,
``chunks_in``) over the data plane (``dataplane``). A thin zmq shell runs it
(``shell``, and ``hostshell`` for a host relay). Runs in relay processes; imports ``wire``
and ``host`` only.
"""
