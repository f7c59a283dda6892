"""Relay processes: the nodes of the tree and the host relays.

A pure core takes frames and events in and gives sends out (``core`` with
``events``, ``pending``, ``routes``, ``liveness``, ``surveys``, ``bulk``,
``sharing``, ``stock``), and holds its parts as fields, each given a
``context`` and owning its state (``heartbeat``, ``hostfold``, every timer
in ``deadlines``); a thin zmq shell runs it (``shell``, and ``hostshell`` for
a host relay). Runs in relay processes; imports ``wire``
and ``host`` only.
"""
