"""Nested NumPy on engines that share a host, under each compose mode.

    python -m ipyparallel_broadcast.tools.compose_bench --engines 2 4 8
    python -m ipyparallel_broadcast.tools.compose_bench --engines 4 --quick --json out.json

Modelled on Malakhov et al. (SciPy 2017). Balanced workloads split a fixed
amount of work evenly over all E engines: ``eig`` (256x256 eigenproblems),
``qr`` (QR of tall blocks) and ``matmul`` (block products). The unbalanced
one, ``phases``, runs the same matmul work three times: on 1 engine, on half
of them and on all of them, and sums the three times.

The default mode runs on engines started without limits, as ipyparallel's
are; the others on engines started in the static mode, switched at run time
(``view.compose(...)``). Modes take turns within each round. The table gives the median wall time, its ratio to
the default mode, and the peak number of runnable threads in the engines
(sampled from ``/proc`` every 10 ms): a direct view of oversubscription.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import tempfile
import threading
import time
from contextlib import ExitStack

# name: (mode, settings) as given to BroadcastView.compose
MODES = {
    "default": ("default", {}),
    "static": ("static", {}),
    "static-pin": ("static", {"pin": True}),
    "static-f2": ("static", {"factor": 2}),
    "counting": ("counting", {}),
}
# name: (engine function, total work items, item size); quick sizes in QUICK
WORKLOADS = {
    "eig": ("eig_work", 96, 256),
    "qr": ("qr_work", 48, 1024),
    "matmul": ("matmul_work", 48, 768),
    "phases": ("matmul_work", 24, 1024),
}
QUICK = {"eig": 16, "qr": 16, "matmul": 16, "phases": 8}


def _matrix(rows, cols=None):
    import numpy as np

    return np.random.default_rng(0).random((rows, cols or rows))


def eig_work(count: int, size: int) -> int:
    import numpy as np

    a = _matrix(size)
    for _ in range(count):
        np.linalg.eig(a)
    return count


def qr_work(count: int, size: int) -> int:
    import numpy as np

    a = _matrix(size, size // 4)
    for _ in range(count):
        np.linalg.qr(a)
    return count


def matmul_work(count: int, size: int) -> int:
    a = _matrix(size)
    for _ in range(count):
        a @ a
    return count


class Sampler:
    """Peak and mean runnable threads over a set of processes, from ``/proc``."""

    def __init__(self, pids, period=0.01):
        self.pids, self.period = list(pids), period
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def runnable(self) -> int:
        count = 0
        for pid in self.pids:
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except FileNotFoundError:
                continue
            for tid in tids:
                try:
                    with open(f"/proc/{pid}/task/{tid}/stat") as f:
                        count += f.read().rpartition(")")[2].split()[0] == "R"
                except FileNotFoundError:
                    pass
        return count

    def _run(self):
        while not self._stop.wait(self.period):
            self.samples.append(self.runnable())

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def warm(rc, engines: int):
    """Load NumPy and start every pool: each workload once, one item per engine."""
    for name in WORKLOADS:
        run_workload(rc, name, engines, total=engines)


def run_workload(rc, name: str, engines: int, quick: bool = False, total: int = 0) -> float:
    """Wall time of one workload on the first ``engines`` engines (``total``
    items, or the workload's full or quick amount)."""
    fname, full, size = WORKLOADS[name]
    total = total or (QUICK[name] if quick else full)
    # by reference, from the installed module even when this one is __main__
    fn = getattr(importlib.import_module("ipyparallel_broadcast.tools.compose_bench"), fname)
    ids = rc.ids[:engines]
    if name != "phases":
        t0 = time.perf_counter()
        rc.broadcast_view(targets=ids).apply_sync(fn, total // len(ids), size)
        return time.perf_counter() - t0
    elapsed = 0.0
    for busy in sorted({1, max(1, len(ids) // 2), len(ids)}):
        t0 = time.perf_counter()
        rc.broadcast_view(targets=ids[:busy]).apply_sync(fn, max(1, total // busy), size)
        elapsed += time.perf_counter() - t0
    return elapsed


def measure(clients, engines: int, modes: list[str], workloads: list[str], reps: int, quick: bool):
    """``{workload: {mode: {"time": median s, "peak": threads, "mean": threads}}}``;
    ``clients``: ``{"default": client, "composed": client}``."""
    pids = {k: rc.broadcast_view().apply_sync(os.getpid) for k, rc in clients.items()}
    for rc in clients.values():
        warm(rc, engines)
    raw: dict[str, dict[str, list]] = {w: {m: [] for m in modes} for w in workloads}
    for _ in range(reps):
        for mode in modes:
            which = "default" if mode == "default" else "composed"
            rc = clients[which]
            if which == "composed":
                kind, settings = MODES[mode]
                rc.broadcast_view().compose(kind, **settings)
            for name in workloads:
                with Sampler(pids[which]) as s:
                    t = run_workload(rc, name, engines, quick)
                raw[name][mode].append(
                    (t, max(s.samples, default=0), statistics.fmean(s.samples) if s.samples else 0.0)
                )
    return {
        w: {
            m: {
                "time": statistics.median(r[0] for r in runs),
                "peak": max(r[1] for r in runs),
                "mean": statistics.fmean(r[2] for r in runs),
            }
            for m, runs in by_mode.items()
        }
        for w, by_mode in raw.items()
    }


def describe(reps: int, quick: bool) -> str:
    """What a run measured, on what: printed above its tables."""
    import textwrap

    import numpy as np
    from threadpoolctl import threadpool_info

    blas = [
        f"{i['internal_api']} {i['version']} ({i.get('threading_layer')})"
        for i in threadpool_info()
        if i["user_api"] == "blas"
    ]
    n = {w: (QUICK[w] if quick else count, size) for w, (_, count, size) in WORKLOADS.items()}
    text = (
        f"{os.cpu_count()} cores, NumPy {np.__version__} with {', '.join(blas) or 'no BLAS found'}. "
        f"Work is split evenly over the E engines: eig {n['eig'][0]} eigenproblems of "
        f"{n['eig'][1]}x{n['eig'][1]}, qr {n['qr'][0]} QRs of {n['qr'][1]}x{n['qr'][1] // 4}, matmul "
        f"{n['matmul'][0]} products of {n['matmul'][1]}x{n['matmul'][1]}; phases is {n['phases'][0]} "
        f"products of {n['phases'][1]}x{n['phases'][1]} on 1 engine, then on E/2, then on all E (the "
        "three times added). default runs on engines started without limits (as ipyparallel's), "
        "the other modes on engines started static and switched at run time. Times are medians of "
        f"{reps} interleaved rounds; peak thr / mean thr are the runnable threads in all engines, "
        "sampled every 10 ms."
    )
    return textwrap.fill(text, 92)


def table(engines: int, results) -> str:
    lines = [
        f"E={engines} engines on one host ({os.cpu_count()} cores)",
        f"{'workload':<9} {'mode':<11} {'time':>8} {'vs default':>10} {'peak thr':>8} {'mean thr':>8}",
    ]
    for w, by_mode in results.items():
        base = by_mode.get("default", {}).get("time")
        for m, r in by_mode.items():
            ratio = f"{base / r['time']:.2f}x" if base else "-"
            lines.append(f"{w:<9} {m:<11} {r['time']:>7.3f}s {ratio:>10} {r['peak']:>8} {r['mean']:>8.1f}")
    return "\n".join(lines)


def run(engine_counts, modes, workloads, reps, quick=False, out=print):
    from ..launch.launcher import Cluster

    report = {}
    for n in engine_counts:
        with ExitStack() as stack:
            clients = {}
            for which, compose in (("default", "default"), ("composed", "static")):
                if which == "default" and "default" not in modes:
                    continue
                cluster = Cluster(
                    n=n,
                    depth=1,
                    log_level=40,
                    compose=compose,
                    profile_dir=stack.enter_context(tempfile.TemporaryDirectory()),
                )
                clients[which] = rc = cluster.start_and_connect_sync()
                stack.callback(cluster.stop_cluster_sync)
                stack.callback(rc.close)
                rc.wait_for_engines(n, timeout=120)
            report[n] = measure(clients, n, modes, workloads, reps, quick)
        out(table(n, report[n]))
        out("")
    return report


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="small work sizes (a smoke run)")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    print(describe(args.reps, args.quick), end="\n\n", flush=True)
    report = run(args.engines, args.modes, args.workloads, args.reps, args.quick)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cores": os.cpu_count(), "quick": args.quick, "results": report}, f, indent=1)


if __name__ == "__main__":
    main()
