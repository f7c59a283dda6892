"""The tree at scale on simulated engines (``ipyparallel_broadcast.tools.sim``):
1 kB round trip (coalesced or streamed, by view) and many async calls, by
engine count and tree (DEPTHxFANOUT), ours against DirectView and
ipyparallel's BroadcastView driven by the same kind of farm."""

import time

import numpy as np
import psutil

from . import common, pool
from .profiles import current

P = current()
MANY = 5


class Farm:
    params = (list(P.farm), list(P.trees), list(common.FARM_VIEWS))
    param_names = ["engines", "tree", "view"]
    timeout = max(P.timeout, 600)

    def setup(self, n, tree, view):
        self.view = common.farm_view(view, n, tree)
        self.data = np.ones(128)
        self.view.apply_sync(common.echo, self.data)

    def time_round_trip(self, n, tree, view):
        self.view.apply_sync(common.echo, self.data)

    def time_many(self, n, tree, view):
        ars = [self.view.apply_async(common.echo, self.data) for _ in range(MANY)]
        for ar in ars:
            ar.get()


CENTER_VIEWS = ("DirectView", "ipp BroadcastView coalescing", "ours coalescing", "ours streaming")


class Center:
    """The center's CPU per 1 kB call (ms): this client plus every controller
    process, with the simulated engines as ``pool.SIM_HOSTS`` hosts (ours: each
    behind its host relay; ipyparallel's: the same engines, straight to it).
    Raw CPU over ``CALLS`` calls, idle time between them included."""

    params = (list(P.farm), list(CENTER_VIEWS))
    param_names = ["engines", "view"]
    timeout = max(P.timeout, 600)
    CALLS = 5

    def setup(self, n, view):
        kind = "ours-simhosts" if view.startswith("ours") else "stock-sim"
        rc = common.client(kind, n)
        self.view = (
            rc[:]
            if view == "DirectView"
            else rc.broadcast_view(coalescing=view == "ours coalescing")
            if view.startswith("ours")
            else rc.broadcast_view(is_coalescing=True)
        )
        controller = psutil.Process(pool.controller_pid(kind, n))
        self.center = [controller] + controller.children(recursive=True)
        self.data = np.ones(128)
        self.view.apply_sync(common.echo, self.data)

    def track_center_cpu_ms(self, n, view):
        from ipyparallel_broadcast.tools.bench import cpu_seconds

        before = time.process_time() + cpu_seconds(self.center)
        for _ in range(self.CALLS):
            self.view.apply_sync(common.echo, self.data)
        return 1e3 * (time.process_time() + cpu_seconds(self.center) - before) / self.CALLS

    track_center_cpu_ms.unit = "ms"
