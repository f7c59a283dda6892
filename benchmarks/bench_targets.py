"""The per-call figures the project aims at, as ratios that do not move with
the machine's speed: ours against DirectView on the same engine count, both
clusters up, timed in interleaved rounds (median of ``ROUNDS``). A ratio
that grows is a regression. The center's CPU per call at 1,024 simulated
engines is ``bench_farm.Center.track_center_cpu_ms``; the client's and the
cluster's CPU against Dask's ``Client.run``, ``CpuAgainstDask`` (and, with
each part apart, ``benchmarks/scripts/client_cpu.py --peers``)."""

import os
import statistics
import time

import numpy as np
import psutil

from . import common, pool
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


class CpuAgainstDask:
    """Client and cluster CPU per 1 kB echo to every engine, net of each
    system's idle rate: ours (coalescing) / Dask's ``Client.run`` (target: 0.5)."""

    params = ([min(16, max(P.peers))],)
    param_names = ["engines"]
    timeout = P.timeout
    unit = "ratio"
    CALLS = 30
    IDLE = 2.0  # seconds each system's idle rate is measured over

    def setup(self, n):
        from ipyparallel_broadcast.tools.bench import cpu_seconds

        self.ours, self.dask = common.view("ours coalescing", n), common.peer_view("Dask run", n)
        controller = psutil.Process(pool.controller_pid("ours", n))
        engines = [psutil.Process(pid) for pid in self.ours.apply_sync(os.getpid)]
        ours = [controller, *controller.children(recursive=True), *engines]
        ours += [c for e in engines for c in e.children(recursive=True)]
        scheduler = psutil.Process(pool.controller_pid("dask", n))  # its nannies too; workers are its children
        dask = [scheduler, *scheduler.children(recursive=True)]
        self.data = np.ones(128)
        self.cpu = {}
        for view, procs in ((self.ours, ours), (self.dask, dask)):
            view.apply_sync(common.echo, self.data)
            self.cpu[id(view)] = lambda procs=procs: time.process_time() + cpu_seconds(procs)
        self.idle = {}
        for view in (self.ours, self.dask):
            cpu, tic = self.cpu[id(view)](), time.perf_counter()
            time.sleep(self.IDLE)  # the measured idle window: nothing is sent
            self.idle[id(view)] = (self.cpu[id(view)]() - cpu) / (time.perf_counter() - tic)

    def _cpu_per_call(self, view) -> float:
        cpu, tic = self.cpu[id(view)](), time.perf_counter()
        for _ in range(self.CALLS):
            view.apply_sync(common.echo, self.data)
        used = self.cpu[id(view)]() - cpu - self.idle[id(view)] * (time.perf_counter() - tic)
        return used / self.CALLS

    def track_cpu_ratio(self, n):
        ratios = [self._cpu_per_call(self.ours) / self._cpu_per_call(self.dask) for _ in range(3)]
        return statistics.median(ratios)
