"""ipyparallel-broadcast: one call to many IPython Parallel engines, through a
tree of relay schedulers.

>>> import ipyparallel_broadcast as ipb
>>> rc = ipb.Cluster(n=8, depth=2).start_and_connect_sync()
>>> rc.broadcast_view().apply_sync(lambda: 1)
"""

from .client import Client, NotABroadcastController, TreeLayout
from .launcher import BroadcastControllerLauncher, Cluster
from .reduction import ReduceError
from .topology import TreeShape
from .view import AUTO, Batch, BroadcastView

__version__ = "0.1.0"

__all__ = [
    "AUTO",
    "Batch",
    "ReduceError",
    "BroadcastControllerLauncher",
    "BroadcastView",
    "Client",
    "Cluster",
    "NotABroadcastController",
    "TreeLayout",
    "TreeShape",
]
