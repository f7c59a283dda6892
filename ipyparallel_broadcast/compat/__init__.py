"""Seams to the upstreams: one module per upstream holds every use of its
private members (``ipp``: IPython Parallel, ``ipykernel``, ``pyzmq``), each
with a line that says why; no other module names one (``tests/test_layout.py``).
Imports ``wire`` (``ipp``: nothing of ours)."""
