"""Peers on the same workload, at the same worker counts: Dask's
``Client.run`` and pinned ``submit`` beside DirectView, ipyparallel's
BroadcastView and ours; and an MPI job's ``bcast`` + ``gather`` (mpi4py,
timed inside the job, so it is tracked as a value rather than timed by asv)."""

import numpy as np

from ipyparallel_broadcast.tools import peers

from . import common
from .profiles import current

P = current()
MANY = 20


class Peers:
    params = (list(P.peers), list(common.PEER_VIEWS))
    param_names = ["engines", "view"]
    timeout = P.timeout

    def setup(self, n, view):
        self.view = common.peer_view(view, n)
        self.data = np.ones(128)
        self.view.apply_sync(common.echo, self.data)

    def time_echo(self, n, view):
        self.view.apply_sync(common.echo, self.data)

    def time_many(self, n, view):
        ars = [self.view.apply_async(common.echo, self.data) for _ in range(MANY)]
        for ar in ars:
            ar.get()


class MPI:
    """mpiexec -n N+1: rank 0 broadcasts 1 kB and gathers N replies; median
    seconds per call, measured inside one MPI job per engine count."""

    params = (list(P.peers),)
    param_names = ["engines"]
    timeout = P.timeout * len(P.peers)
    unit = "seconds"

    def setup_cache(self):
        if not peers.mpi_available():
            return {}  # (asv passes no cache at all when it is None)
        return {n: peers.mpi_job(n, reps=10, many=MANY) for n in P.peers}

    def setup(self, jobs, n):
        if not jobs:
            raise NotImplementedError("MPI (mpiexec and mpi4py) is not installed")

    def track_echo(self, jobs, n):
        return jobs[n]["echo"]

    def track_many_per_call(self, jobs, n):
        return 1 / jobs[n]["many"]
