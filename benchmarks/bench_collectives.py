"""Our own suites: scatter, gather, map, reduce and allreduce, each view its
own way (DirectView and ipyparallel's BroadcastView: one message per engine,
reduce pulls every array and sums on the client, allreduce pushes that sum
back; ours: one message, reduce combined in the tree, allreduce's sum sent
down from the root), and partial coalescing against the other reply modes."""

import functools

import ipyparallel as ipp
import numpy as np

import ipyparallel_broadcast as ipb

from . import common
from .profiles import current

P = current()
MAP_ITEMS = 10_000


@ipp.interactive
def local_array():
    return R  # noqa: F821  (set on every engine in setup)


def cheap(x):
    return x + 1


class Collectives(common.EveryView):
    def setup(self, n, view):
        super().setup(n, view)
        self.chunks = np.ones((n * 128, 1024))  # 1 MB per engine
        self.view.execute("import numpy as np; R = np.ones(131072)", block=True)
        self.view.scatter("g", self.chunks, block=True)

    def time_scatter(self, n, view):
        self.view.scatter("g", self.chunks, block=True)

    def time_gather(self, n, view):
        self.view.gather("g", block=True)

    def time_map(self, n, view):
        self.view.map_sync(cheap, range(MAP_ITEMS))

    def time_reduce_sum(self, n, view):
        if isinstance(self.view, ipb.BroadcastView):
            self.view.reduce(local_array, op="sum", block=True)
        else:
            functools.reduce(np.add, self.view.apply_sync(local_array))

    def time_allreduce_sum(self, n, view):
        if isinstance(self.view, ipb.BroadcastView):
            self.view.allreduce(local_array, op="sum", name="S", block=True)
        else:
            self.view.push({"S": functools.reduce(np.add, self.view.apply_sync(local_array))}, block=True)


class PartialCoalescing:
    """Time until every reply is in, by reply mode and batch size."""

    params = (list(P.engines), ["coalescing", "streaming", "Batch(2)", "Batch(8)", "auto"])
    param_names = ["engines", "mode"]
    timeout = P.timeout

    def setup(self, n, mode):
        modes = {
            "coalescing": True,
            "streaming": False,
            "Batch(2)": ipb.Batch(2),
            "Batch(8)": ipb.Batch(8),
            "auto": "auto",
        }
        self.view = common.client("ours", n).broadcast_view(coalescing=modes[mode])
        self.data = np.ones(128)
        self.view.apply_sync(common.echo, self.data)

    def time_all_replies(self, n, mode):
        ar = self.view.apply_async(common.echo, self.data)
        for _ in ar:  # results as they come, as a caller watching them would
            pass
