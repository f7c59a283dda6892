"""ipyparallel-broadcast: one call to many IPython Parallel engines, through a
tree of relay schedulers.

>>> import ipyparallel_broadcast as ipb
>>> rc = ipb.Cluster(n=8, depth=2).start_and_connect_sync()
>>> rc.broadcast_view().apply_sync(lambda: 1)

Names load on first use, so that an engine (``ipyparallel_broadcast.engine``)
can set its thread limits before anything imports NumPy.
"""

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "AUTO": "client.view",
    "Batch": "client.view",
    "BroadcastView": "client.view",
    "ReduceError": "wire.reduction",
    "BroadcastControllerLauncher": "launch.launcher",
    "BroadcastEngineSetLauncher": "launch.launcher",
    "BroadcastSlurmControllerLauncher": "launch.batch",
    "BroadcastSlurmEngineSetLauncher": "launch.batch",
    "Cluster": "launch.launcher",
    "Client": "client.client",
    "NotABroadcastController": "client.client",
    "TreeLayout": "client.treeinfo",
    "TreeShape": "wire.topology",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name == "compose":
        return importlib.import_module(".engine.compose", __name__)
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + __all__)
