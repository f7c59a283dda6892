"""Seams to the upstreams: one module per upstream holds every use of its
private members (``pyzmq``, ``ipykernel``), each with a line that says why.
Imports ``wire``."""
