"""One host: its identity and its shared memory.

Who shares a host with whom (``link``: labels, derived keys, a host relay's
start) and the segments its engines map (``shm``). Used by the engine, the
relay and the controller processes; imports only ``wire``.
"""
