"""Peers measured with the same workloads: Dask distributed and an MPI job.

- ``DaskRun``: ``Client.run`` on every worker (Dask's broadcast);
- ``DaskSubmit``: one ``submit`` pinned to each worker, then ``gather``;
- ``mpi_job``: ``mpiexec -n N+1`` running ``mpi4py`` ``bcast`` + ``gather``
  (rank 0 plays the client, ranks 1..N the engines), timed inside the job:
  the lower bound of what a broadcast and its replies can cost.

Both Dask adapters offer what the quick runner calls on a view
(``apply_sync``, ``apply_async(...).get()``, ``push``), so they take part in
its interleaved rounds.

    python -m ipyparallel_broadcast.tools.peers mpi --engines 16   # the MPI job alone, JSON out
    python -m ipyparallel_broadcast.tools.peers dask-serve --engines 16 --address-file F
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

MPI_MEASURES = ("echo", "many", "push")


def dask_cluster(n: int):
    """A local Dask cluster of n single-threaded worker processes and its client."""
    from distributed import Client, LocalCluster

    cluster = LocalCluster(
        n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=50
    )  # not the shutdown race
    client = Client(cluster)
    client.wait_for_workers(n)
    return cluster, client


def _store(ns):
    globals().update(ns)


class _DaskView:
    def __init__(self, client):
        self.client = client
        self.workers = sorted(client.scheduler_info()["workers"])

    def __len__(self):
        return len(self.workers)

    def push(self, ns, block=True):
        self.client.run(_store, ns)


class _Done:
    def __init__(self, get):
        self.get = get


class DaskRun(_DaskView):
    """``Client.run(f, x)`` on every worker; async calls run from a thread pool."""

    def __init__(self, client):
        super().__init__(client)
        self.pool = ThreadPoolExecutor(32)

    def apply_sync(self, f, *args):
        return list(self.client.run(f, *args).values())

    def apply_async(self, f, *args):
        future = self.pool.submit(self.apply_sync, f, *args)
        return _Done(future.result)


class DaskSubmit(_DaskView):
    """One task per worker, pinned (``workers=[w]``), then ``gather``."""

    def apply_async(self, f, *args):
        futures = [
            self.client.submit(f, *args, workers=[w], allow_other_workers=False, pure=False) for w in self.workers
        ]
        return _Done(lambda: self.client.gather(futures))

    def apply_sync(self, f, *args):
        return self.apply_async(f, *args).get()


# ---------------------------------------------------------------- MPI job
def mpi_available() -> bool:
    if shutil.which("mpiexec") is None:
        return False
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return True


def mpi_job(
    n: int, reps: int = 25, many: int = 20, echo_bytes: int = 1024, push_bytes: int = 1 << 20, timeout: float = 600
) -> dict:
    """Medians (seconds; ``many`` in calls per second) from an MPI job of n+1 ranks."""
    if not mpi_available():
        raise RuntimeError(
            "MPI is not available: install mpich (apt-get install mpich libmpich-dev) "
            "and mpi4py (pip install --no-binary mpi4py mpi4py)"
        )
    cmd = [
        "mpiexec",
        "-n",
        str(n + 1),
        sys.executable,
        "-m",
        "ipyparallel_broadcast.tools.peers",
        "_rank",
        "--reps",
        str(reps),
        "--many",
        str(many),
        "--echo-bytes",
        str(echo_bytes),
        "--push-bytes",
        str(push_bytes),
    ]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if done.returncode:
        raise RuntimeError(f"MPI job failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _echo(x):
    return x


def _rank_main(args):
    """Inside the MPI job: rank 0 broadcasts and gathers, the others answer."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    root = comm.rank == 0
    echo = np.ones(args.echo_bytes // 8)
    push = np.ones(args.push_bytes // 8)

    def call(data, reply):
        x = comm.bcast(data if root else None, root=0)
        return comm.gather(None if root else reply(x), root=0)

    def timed(fn):
        comm.Barrier()
        tic = time.perf_counter()
        fn()
        return time.perf_counter() - tic

    def many():
        for _ in range(args.many):
            call(echo, _echo)

    samples = {m: [] for m in MPI_MEASURES}
    call(push, _echo)  # warm up
    for _ in range(args.reps):
        samples["echo"].append(timed(lambda: call(echo, _echo)))
        samples["many"].append(args.many / timed(many))
        samples["push"].append(timed(lambda: call(push, lambda x: None)))
    if root:
        print(json.dumps({m: statistics.median(s) for m, s in samples.items()}))


def dask_serve(n: int, address_file: str):
    """Run a local Dask cluster until SIGTERM; its scheduler address goes to ``address_file``."""
    import signal

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    cluster, client = dask_cluster(n)
    try:
        tmp = address_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(cluster.scheduler_address)
        os.replace(tmp, address_file)
        while True:
            signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        client.close()
        cluster.close()


def main(argv=None):
    parser = argparse.ArgumentParser(description="Peers: the MPI bcast+gather job, a Dask cluster.")
    parser.add_argument("command", choices=["mpi", "dask-serve", "_rank"])
    parser.add_argument("--address-file", help="dask-serve: where to write the scheduler's address")
    parser.add_argument("--engines", type=int, default=16)
    parser.add_argument("--reps", type=int, default=25)
    parser.add_argument("--many", type=int, default=20)
    parser.add_argument("--echo-bytes", type=int, default=1024)
    parser.add_argument("--push-bytes", type=int, default=1 << 20)
    args = parser.parse_args(argv)
    if args.command == "_rank":
        _rank_main(args)
    elif args.command == "dask-serve":
        dask_serve(args.engines, args.address_file)
    else:
        print(json.dumps(mpi_job(args.engines, args.reps, args.many, args.echo_bytes, args.push_bytes)))


if __name__ == "__main__":
    main()
