"""One copy per host: the memory and time of pushing one big NumPy array to
every engine of one host, for each way of doing it.

    python benchmarks/scripts/shm_push.py --mib 256 --engines 8 --out benchmarks/results/shm-push-256m-n8.md
    python benchmarks/scripts/shm_push.py --mib 1024 --engines 16 --ways ours,memmap \\
        --out benchmarks/results/shm-push-1g-n16.md
    python benchmarks/scripts/shm_push.py --threshold --engines 8 --out benchmarks/results/shm-threshold-n8.md

Each way runs alone on the host: its cluster starts, the array is pushed
and every engine reads it all (its pages are touched), then ``del`` on every
engine, then three more calls; the cluster stops before the next way starts.
Memory is the host's, summed over every process: PSS (``/proc/PID/smaps_rollup``,
so a shared page counts once), and a strict figure that also counts
shared-memory files nobody maps: the sum of ``Pss - Pss_Shmem`` plus
``Shmem`` of ``/proc/meminfo``. Gains are in multiples of the array's size
M, from the moment before the push (the client holds its array throughout).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack

import numpy as np
from traitlets.config import Config

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ipyparallel as ipp  # noqa: E402
from report import report  # noqa: E402

import ipyparallel_broadcast as ipb  # noqa: E402

WAYS = ("ours", "ours-noshm", "directview", "ipp-broadcast", "memmap", "dask")
LABELS = {
    "ours": "ours: BroadcastView, one copy per host",
    "ours-noshm": "ours, shared_memory=False (before)",
    "directview": "DirectView",
    "ipp-broadcast": "ipp BroadcastView (coalescing)",
    "memmap": "memmap recipe (push to one engine, np.save to /dev/shm, np.load(mmap_mode='c'))",
    "dask": "Dask client.scatter(broadcast=True)",
}


def host_memory() -> dict:
    """Bytes: PSS over every process, and the strict figure (see the module)."""
    pss = pss_shmem = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        pss += int(line.split()[1]) * 1024
                    elif line.startswith("Pss_Shmem:"):
                        pss_shmem += int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            continue  # gone, or a kernel thread
    with open("/proc/meminfo") as f:
        shmem = next(int(line.split()[1]) * 1024 for line in f if line.startswith("Shmem:"))
    return dict(pss=pss, strict=pss - pss_shmem + shmem)


class Way:
    """A cluster and the three steps measured: push, touch, drop."""

    def __init__(self, stack: ExitStack, n: int):
        self.n = n

    def touch(self) -> list:
        return self.view.apply_sync(_touch)

    def drop(self):
        self.view.execute("del big; import gc; gc.collect()", block=True)

    def call(self):
        self.view.apply_sync(_touch_none)


def _touch():
    return float(big.sum())  # noqa: F821


def _touch_none():
    return None


def _ipb_cluster(stack: ExitStack, n: int, shm: bool, threshold: int = 1 << 20):
    config = Config()
    config.BroadcastController.shared_memory = shm
    config.BroadcastController.shared_memory_threshold = threshold
    cluster = ipb.Cluster(
        n=n,
        log_level=40,
        engine_timeout=max(120, 4 * n),
        config=config,
        profile_dir=stack.enter_context(tempfile.TemporaryDirectory()),
    )
    rc = cluster.start_and_connect_sync()
    stack.callback(cluster.stop_cluster_sync)
    stack.callback(rc.close)
    rc.wait_for_engines(n, timeout=max(120, 4 * n))
    return rc


def _stock_cluster(stack: ExitStack, n: int):
    cluster = ipp.Cluster(
        n=n,
        log_level=40,
        engine_timeout=max(120, 4 * n),
        profile_dir=stack.enter_context(tempfile.TemporaryDirectory()),
    )
    rc = cluster.start_and_connect_sync()
    stack.callback(cluster.stop_cluster_sync)
    stack.callback(rc.close)
    rc.wait_for_engines(n, timeout=max(120, 4 * n))
    return rc


class Ours(Way):
    def __init__(self, stack, n, shm=True, threshold=1 << 20):
        super().__init__(stack, n)
        self.rc = _ipb_cluster(stack, n, shm, threshold)
        self.view = self.rc.broadcast_view(coalescing=True)

    def push(self, data):
        self.view.push(dict(big=data), block=True)

    def stats(self) -> str:
        nodes = [s for s in self.rc.broadcast_stats() if "shm_bytes" in s]
        return (
            f"segments {sum(s['shm_segments'] for s in nodes)}, "
            f"written {sum(s['shm_bytes'] for s in nodes) / 2**20:.0f} MiB, "
            f"engine copies avoided {sum(s['shm_saved'] for s in nodes) / 2**20:.0f} MiB"
        )


class Stock(Way):
    def __init__(self, stack, n, broadcast: bool):
        super().__init__(stack, n)
        rc = _stock_cluster(stack, n)
        self.view = rc.broadcast_view(is_coalescing=True) if broadcast else rc[:]

    def push(self, data):
        self.view.push(dict(big=data), block=True)


class Memmap(Way):
    """IPython Parallel's "memmap Broadcast" example notebook, done right on
    one host: one engine gets the array and saves it as ``.npy`` in
    ``/dev/shm``; every engine maps it copy-on-write with its dtype and offset
    (``np.load(mmap_mode="c")``); the file is removed once all have mapped it."""

    def __init__(self, stack, n):
        super().__init__(stack, n)
        rc = _ipb_cluster(stack, n, shm=False)
        self.one, self.view = rc[rc.ids[0]], rc[:]

    def push(self, data):
        path = f"/dev/shm/memmap-recipe-{uuid.uuid4().hex}.npy"
        self.one.push(dict(big=data), block=True)
        self.one.execute(f"import numpy as np; np.save({path!r}, big); del big", block=True)
        self.view.execute(f"import numpy as np; big = np.load({path!r}, mmap_mode='c')", block=True)
        os.unlink(path)


class Dask(Way):
    def __init__(self, stack, n):
        super().__init__(stack, n)
        from ipyparallel_broadcast.tools.peers import dask_cluster

        cluster, self.client = dask_cluster(n)
        stack.callback(cluster.close)
        stack.callback(self.client.close)
        self.future = None

    def push(self, data):
        self.future = self.client.scatter(data, broadcast=True)

    def touch(self) -> list:
        return list(self.client.run(_dask_sum, self.future.key).values())

    def drop(self):
        self.future.release()
        self.future = None
        while any(self.client.run(_dask_holds).values()):  # released asynchronously
            time.sleep(0.05)

    def call(self):
        self.client.run(_touch_none)


def _dask_sum(key, dask_worker=None):
    return float(dask_worker.data[key].sum())


def _dask_holds(dask_worker=None):
    return len(dask_worker.data)


def make(way: str, stack: ExitStack, n: int) -> Way:
    return {
        "ours": lambda: Ours(stack, n),
        "ours-noshm": lambda: Ours(stack, n, shm=False),
        "directview": lambda: Stock(stack, n, False),
        "ipp-broadcast": lambda: Stock(stack, n, True),
        "memmap": lambda: Memmap(stack, n),
        "dask": lambda: Dask(stack, n),
    }[way]()


def measure(way: str, n: int, data: np.ndarray, reps: int) -> dict:
    with ExitStack() as stack:
        w = make(way, stack, n)
        w.push(np.ones(16))  # warm: imports, connections
        w.touch()
        w.drop()
        gc.collect()
        start = host_memory()
        tic = time.perf_counter()
        w.push(data)
        times = [time.perf_counter() - tic]
        touched = w.touch()
        assert len(touched) == n and np.allclose(touched, data.sum()), touched  # every engine read it
        pushed = host_memory()
        w.drop()
        dropped = host_memory()
        for _ in range(3):
            w.call()
        later = host_memory()
        stats = w.stats() if isinstance(w, Ours) else ""
        for _ in range(reps - 1):
            tic = time.perf_counter()
            w.push(data)
            times.append(time.perf_counter() - tic)
            w.drop()
    m = data.nbytes
    gain = {k: [(s[k] - start[k]) / m for s in (pushed, dropped, later)] for k in ("pss", "strict")}
    return dict(times=times, gain=gain, stats=stats)


def threshold_rows(n: int, reps: int) -> list:
    """Median push time by size, shared memory on and off: where sharing starts to pay."""
    sizes = [2**k for k in range(16, 25, 2)]  # 64 KiB .. 16 MiB
    times = {}
    for shm in (True, False):
        with ExitStack() as stack:
            view = Ours(stack, n, shm=shm, threshold=sizes[0]).view
            for size in sizes:
                data = np.ones(size // 8)
                one = []
                for _ in range(reps + 1):
                    tic = time.perf_counter()
                    view.push(dict(big=data), block=True)
                    one.append(time.perf_counter() - tic)
                times[shm, size] = statistics.median(one[1:])  # the first warms
    lines = ["| size | shared memory (ms) | copies (ms) | ratio |", "|---:|---:|---:|---:|"]
    for size in sizes:
        on, off = times[True, size], times[False, size]
        lines.append(f"| {size // 1024} KiB | {1e3 * on:.1f} | {1e3 * off:.1f} | {on / off:.2f} |")
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--engines", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3, help="pushes timed per way (the first is measured)")
    parser.add_argument("--ways", default=",".join(WAYS))
    parser.add_argument(
        "--threshold", action="store_true", help="push time by size with shared memory on (from 64 KiB) and off"
    )
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    if args.threshold:
        lines = [
            f"{os.cpu_count()} cores; {args.engines} engines on this host; median of {10} pushes "
            "(BroadcastView, coalescing) by array size.",
            "",
        ] + threshold_rows(args.engines, 10)
        report("shm_push.py", argv, f"Where one copy per host starts to pay: {args.engines} engines", lines, args.out)
        return
    data = np.random.default_rng(0).random(args.mib * 2**20 // 8)
    rows = {way: measure(way, args.engines, data, args.reps) for way in args.ways.split(",")}
    base = rows.get("ours-noshm")
    lines = [
        f"{os.cpu_count()} cores; {args.mib} MiB float64 array (M) pushed to {args.engines} engines on this host.",
        "Host memory gained over the moment before the push, in multiples of M: after the push and",
        "every engine read the array; right after `del` on every engine; after 3 more calls.",
        "PSS counts mapped pages once; strict also counts /dev/shm files nobody maps.",
        "",
        "| way | push s (median) | push s (each) | PSS: pushed | PSS: after del | PSS: 3 calls later "
        "| strict: pushed | strict: after del | strict: 3 calls later |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for way, r in rows.items():
        cells = [f"{statistics.median(r['times']):.2f}", " ".join(f"{t:.2f}" for t in r["times"])]
        cells += [f"{g:.2f}" for g in r["gain"]["pss"]] + [f"{g:.2f}" for g in r["gain"]["strict"]]
        lines.append(f"| {LABELS[way]} | " + " | ".join(cells) + " |")
    if base and "ours" in rows:
        ratio = statistics.median(rows["ours"]["times"]) / statistics.median(base["times"])
        lines += ["", f"Push time, one copy per host over shared_memory=False: {ratio:.2f}."]
    if "ours" in rows:
        lines += ["", f"broadcast_stats() after the first push (ours): {rows['ours']['stats']}."]
    report("shm_push.py", argv, f"One copy per host: {args.mib} MiB to {args.engines} engines", lines, args.out)


if __name__ == "__main__":
    main()
