"""Start time and memory of local engines: fresh interpreters against engines
forked from one template process (``ipyparallel_broadcast.engine.forked``).

    python benchmarks/scripts/engine_start.py --engines 64 --out benchmarks/results/engine-start-64.md

For each way: the seconds from ``start_cluster`` until every engine has
registered (the controller is up first and not counted), and the PSS (the
process's share of the pages it maps, so shared pages count once over all)
per engine, engine and nanny processes together, the template included.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import report  # noqa: E402

import ipyparallel_broadcast as ipb  # noqa: E402

EXPLAINED = """Start: from `start_engines` until all {n} have registered with the hub (the controller is
already up). Fresh: ipyparallel's launcher starts one interpreter per engine, and each
starts its nanny as another fresh interpreter. Forked: one template process imports the
stack once, freezes its objects out of the garbage collector's reach (`gc.freeze()`) and
forks the engines, each of which forks its nanny. PSS per engine: the engines' and
nannies' PSS, plus the template's, divided by {n}."""


def pss_mb(pids) -> float:
    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_full_info().pss
        except psutil.Error:
            pass
    return total / 2**20


def measure(n: int, fork: bool) -> dict:
    with tempfile.TemporaryDirectory(prefix="ipb-start-") as profile_dir:
        cluster = ipb.Cluster(
            n=n,
            depth=1,
            fanout=2,
            profile_dir=profile_dir,
            log_level=40,
            fork_engines=fork,
            engine_timeout=max(120, 4 * n),
        )
        cluster.start_controller_sync()
        rc = cluster.connect_client_sync()
        try:
            tic = time.perf_counter()
            cluster.start_engines_sync(n)
            rc.wait_for_engines(n, timeout=max(120, 4 * n))
            seconds = time.perf_counter() - tic
            pids = rc.broadcast_view().apply_sync(__import__("os").getpid)
            family = set(pids)
            for pid in pids:
                proc = psutil.Process(pid)
                family.update(k.pid for k in proc.children())
                if fork:
                    family.add(proc.ppid())  # the template
            time.sleep(2)  # let start-up garbage settle
            return dict(seconds=seconds, pss=pss_mb(family) / n, processes=len(family))
        finally:
            rc.close()
            cluster.stop_cluster_sync()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, default=64)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    rows = {way: measure(args.engines, way == "forked") for way in ("fresh", "forked")}
    lines = [
        f"{psutil.cpu_count()} cores.",
        "",
        "| engines | start (s) | s per engine | PSS per engine (MB) | processes |",
        "|---|---:|---:|---:|---:|",
    ]
    for way, r in rows.items():
        lines.append(
            f"| {way} | {r['seconds']:.1f} | {r['seconds'] / args.engines:.2f} | {r['pss']:.1f} | {r['processes']} |"
        )
    lines += ["", EXPLAINED.format(n=args.engines)]
    report("engine_start.py", argv, f"Starting {args.engines} local engines", lines, args.out)


if __name__ == "__main__":
    main()
