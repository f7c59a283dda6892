"""What the suites share: the views compared, built on pooled clusters."""

from __future__ import annotations

import ipyparallel as ipp

import ipyparallel_broadcast as ipb

from . import pool

VIEWS = (
    "DirectView",
    "ipp BroadcastView",
    "ipp BroadcastView coalescing",
    "ours coalescing",
    "ours streaming",
    "ours Batch(8)",
)
_clients = {}  # (kind, n, depth) -> client, for this process


def client(kind: str, n: int, depth: int = 1):
    key = (kind, n, depth)
    if key not in _clients:
        path = pool.connection_file(kind, n, depth)
        _clients[key] = (ipb.Client if kind == "ours" else ipp.Client)(path)
        _clients[key].wait_for_engines(n, timeout=120)
    return _clients[key]


def view(name: str, n: int, depth: int = 1):
    """The view ``name`` over all n engines of a pooled cluster of that depth."""
    if name.startswith("ours"):
        mode = {"ours coalescing": True, "ours streaming": False, "ours Batch(8)": ipb.Batch(8)}[name]
        return client("ours", n, depth).broadcast_view(coalescing=mode)
    if name == "DirectView":
        return client("stock", n, depth)[:]
    if depth == 0:  # ipyparallel 9's BroadcastView fails or hangs with no tree below its root
        raise NotImplementedError("ipyparallel's BroadcastView does not work at depth 0")
    return client("stock", n, depth).broadcast_view(is_coalescing=name.endswith("coalescing"))


def echo(x):
    return x


def noop(x):
    return None
