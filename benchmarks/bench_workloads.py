"""Real workloads, after IPython Parallel's examples (``tools/workloads.py``):
Monte Carlo option pricing, random-matrix eigenvalue spacings, a parameter
sweep and progress published with ``publish_data``, each written once and run
the natural way on DirectView, ipyparallel's BroadcastView and ours; plus a
*track* of how many engines' last published progress reached the client."""

from ipyparallel_broadcast.tools import workloads as W

from . import common


class Workloads(common.EveryView):
    def setup(self, n, view):
        super().setup(n, view)
        for run in W.WORKLOADS.values():  # warm: imports, pushed names, connections
            run(self.view)

    def time_options(self, n, view):
        W.options(self.view)

    def time_rmt(self, n, view):
        W.rmt(self.view)

    def time_sweep(self, n, view):
        W.sweep(self.view)

    def time_progress(self, n, view):
        W.progress(self.view)

    def track_progress_delivered(self, n, view):
        """Engines whose last ``publish_data`` had reached the client when the call was done (of n)."""
        return W.progress(self.view)

    track_progress_delivered.unit = "engines"
