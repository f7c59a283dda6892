"""The tree at scale on simulated engines (``ipyparallel_broadcast.sim``):
1 kB round trip (coalesced or streamed, by view) and many async calls, by
engine count and tree (DEPTHxFANOUT), ours against DirectView and
ipyparallel's BroadcastView driven by the same kind of farm."""

import numpy as np

from . import common
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
