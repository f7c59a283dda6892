"""The per-call figures the project aims at, as ratios that do not move with
the machine's speed: ours against DirectView on the same engine count, both
clusters up, timed in interleaved rounds (median of ``ROUNDS``). A ratio
that grows is a regression. The center's CPU per call at 1,024 simulated
engines is ``bench_farm.Center.track_center_cpu_ms``; the client's and the
cluster's CPU against Dask, ``benchmarks/scripts/client_cpu.py --peers``."""

import statistics
import time

import numpy as np

from . import common
from .profiles import current

P = current()
ROUNDS = 7


def _interleaved_ratio(ours, theirs, call) -> float:
    """Median over rounds of (ours' time / theirs' time), the two timed back to back."""
    ratios = []
    for _ in range(ROUNDS):
        times = []
        for view in (ours, theirs):
            tic = time.perf_counter()
            call(view)
            times.append(time.perf_counter() - tic)
        ratios.append(times[0] / times[1])
    return statistics.median(ratios)


class EchoAgainstDirectView:
    """1 kB echo to every engine: ours (coalescing) / DirectView (target: 0.30)."""

    params = (list(P.peers),)
    param_names = ["engines"]
    timeout = P.timeout
    unit = "ratio"

    def setup(self, n):
        self.ours, self.dv = common.view("ours coalescing", n), common.view("DirectView", n)
        self.data = np.ones(128)
        for view in (self.ours, self.dv):
            view.apply_sync(common.echo, self.data)

    def track_echo_ratio(self, n):
        return _interleaved_ratio(self.ours, self.dv, lambda v: v.apply_sync(common.echo, self.data))


class GatherAgainstDirectView:
    """gather of one 1 MB chunk per engine, depth 2 for ours: ours (coalescing) / DirectView (target: 0.8)."""

    params = ([min(8, max(P.engines))],)  # N=8 where the profile has as many
    param_names = ["engines"]
    timeout = P.timeout
    unit = "ratio"

    def setup(self, n):
        self.ours, self.dv = common.view("ours coalescing", n, depth=2), common.view("DirectView", n, depth=2)
        chunks = np.ones((n * 128, 1024))
        for view in (self.ours, self.dv):
            view.scatter("g", chunks, block=True)
            view.gather("g", block=True)

    def track_gather_ratio(self, n):
        return _interleaved_ratio(self.ours, self.dv, lambda v: v.gather("g", block=True))
