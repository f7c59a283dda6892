"""Nested NumPy on E engines sharing this host, by compose mode (issue 6).

Balanced workloads (eig, QR, matmul split evenly over the engines) and the
unbalanced matmul phases (1, E/2 and E engines busy in turn), as in
``python -m ipyparallel_broadcast.tools.compose_bench``, whose sizes and functions
these are. The default mode runs on engines started without limits; the
others switch the pooled static engines at run time, and teardown puts them
back in the static mode they start in.
"""

import os

from ipyparallel_broadcast.tools import compose_bench as cb

from . import common
from .profiles import current

P = current()
MODES = ("default", "static", "counting")


class Compose:
    params = (list(P.compose), list(MODES), list(cb.WORKLOADS))
    param_names = ["engines", "mode", "workload"]
    timeout = P.timeout

    def setup(self, n, mode, workload):
        # default: engines started without limits (as ipyparallel's are); the
        # other modes switch the pooled cluster's engines, which start static
        self.rc = common.client("ours-default" if mode == "default" else "ours", n)
        view = self.rc.broadcast_view()
        self.pids = view.apply_sync(os.getpid)
        if mode != "default":
            kind, settings = cb.MODES[mode]
            view.compose(kind, **settings)
        cb.warm(self.rc, n)

    def teardown(self, n, mode, workload):
        if mode != "default":
            self.rc.broadcast_view().compose("static")

    def time_workload(self, n, mode, workload):
        cb.run_workload(self.rc, workload, n, P.compose_quick)

    def track_peak_runnable_threads(self, n, mode, workload):
        with cb.Sampler(self.pids) as s:
            cb.run_workload(self.rc, workload, n, P.compose_quick)
        return max(s.samples, default=0)

    track_peak_runnable_threads.unit = "threads"
