"""One host: its identity and its shared memory.

Who shares a host with whom (``link``: labels, derived keys, a host relay's
start), the segments its engines map (``shm``), and the process's freed heap
handed back to the OS (``trim``). Used by the engine, the relay, the
controller and the client processes; imports only ``wire``.
"""
