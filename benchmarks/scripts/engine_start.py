"""Start time and memory of local engines: fresh interpreters against engines
forked from one template process (``ipyparallel_broadcast.forked``).

    python benchmarks/scripts/engine_start.py --engines 64 --out benchmarks/results/engine-start.md

For each way: the seconds from ``start_cluster`` until every engine has
registered (the controller is up first and not counted), and the PSS (the
process's share of the pages it maps, so shared pages count once over all)
per engine, engine and nanny processes together, the template included.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import psutil

import ipyparallel_broadcast as ipb
from ipyparallel_broadcast.tools.bench import write_report


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
        cluster = ipb.Cluster(n=n, depth=1, fanout=2, profile_dir=profile_dir, log_level=40,
                              fork_engines=fork, engine_timeout=max(120, 4 * n))
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
        f"# Starting {args.engines} local engines, {psutil.cpu_count()} cores",
        "",
        "`python benchmarks/scripts/engine_start.py --engines %d`" % args.engines,
        "",
        "| engines | start (s) | s per engine | PSS per engine (MB) | processes |",
        "|---|---:|---:|---:|---:|",
    ]
    for way, r in rows.items():
        lines.append(f"| {way} | {r['seconds']:.1f} | {r['seconds'] / args.engines:.2f} | "
                     f"{r['pss']:.1f} | {r['processes']} |")
    write_report(lines, args.out)


if __name__ == "__main__":
    main()
