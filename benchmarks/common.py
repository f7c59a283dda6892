"""What the suites share: the views compared, built on pooled clusters."""

from __future__ import annotations

import ipyparallel as ipp

import ipyparallel_broadcast as ipb

from . import pool
from .profiles import current

VIEWS = (
    "DirectView",
    "ipp BroadcastView",
    "ipp BroadcastView coalescing",
    "ours coalescing",
    "ours streaming",
    "ours Batch(8)",
)
# suites where ipyparallel's BroadcastView takes its coalescing mode's path either way
VIEWS_ONE_IPP_MODE = tuple(v for v in VIEWS if v != "ipp BroadcastView")
FARM_VIEWS = (
    "DirectView",
    "ipp BroadcastView coalescing",
    "ipp BroadcastView non-coalescing",
    "ours coalescing",
    "ours streaming",
)
PEER_VIEWS = (
    "DirectView",
    "ipp BroadcastView coalescing",
    "ours coalescing",
    "ours streaming",
    "Dask run",
    "Dask submit",
)
_clients = {}  # (kind, n, depth, fanout) -> client, for this process


def client(kind: str, n: int, depth: int = 1, fanout: int = 2):
    key = (kind, n, depth, fanout)
    if key not in _clients:
        path = pool.connection_file(kind, n, depth, fanout)
        if kind == "dask":
            from distributed import Client

            with open(path) as f:
                _clients[key] = Client(f.read())
            _clients[key].wait_for_workers(n)
        else:
            _clients[key] = (ipb.Client if kind.startswith("ours") else ipp.Client)(path)
            _clients[key].wait_for_engines(n, timeout=max(120, n / 10))
    return _clients[key]


def farm_view(name: str, n: int, tree: str):
    """The view ``name`` over n simulated engines; ``tree`` is DEPTHxFANOUT
    (ours: the relay tree; ipyparallel's BroadcastView: its depth, fan-out 2
    only; DirectView: the first tree only, as it has none)."""
    depth, fanout = map(int, tree.split("x"))
    if name.startswith("ours"):
        rc = client("ours-sim", n, depth, fanout)
        return rc.broadcast_view(coalescing=name == "ours coalescing")
    if name == "DirectView":
        if tree != current().trees[0]:
            raise NotImplementedError("DirectView has no tree: measured with the first tree only")
        return client("stock-sim", n, 1)[:]
    if fanout != 2:
        raise NotImplementedError("ipyparallel's broadcast scheduler has fan-out 2 only")
    return client("stock-sim", n, depth).broadcast_view(is_coalescing=name.endswith(" coalescing"))


def peer_view(name: str, n: int):
    """A view of ``VIEWS`` or a Dask peer (``peers.DaskRun``/``DaskSubmit``) over n workers."""
    if name.startswith("Dask"):
        from ipyparallel_broadcast.tools import peers

        return (peers.DaskRun if name == "Dask run" else peers.DaskSubmit)(client("dask", n))
    return view(name, n)


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


class EveryView:
    """A suite over each view of ``VIEWS_ONE_IPP_MODE`` on all engines of a
    pooled cluster, at each engine count of the profile (``self.view``)."""

    params = (list(current().engines), list(VIEWS_ONE_IPP_MODE))
    param_names = ["engines", "view"]
    timeout = current().timeout

    def setup(self, n, name):
        self.view = view(name, n)
