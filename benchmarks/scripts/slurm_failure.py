"""A controller job that exits at once, under a real Slurm on the bed: how
long ``ipcluster start`` takes to say so and exit.

    python benchmarks/scripts/slurm_failure.py --repeat 5 --out benchmarks/results/slurm-controller-failure.md

The controller command is an interpreter without this package (what the docs'
old ``python3 -m ...`` found inside a job), so the job exits 1 at once. Each
run: the seconds from launching ``ipcluster start`` until it exits, its exit
status, whether its output has the job's error line, and whether a cluster
file is left. Needs root and Debian's ``slurm-wlm`` and ``munge``.
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import report  # noqa: E402

from ipyparallel_broadcast.tools.bedcluster import IPCluster  # noqa: E402
from ipyparallel_broadcast.tools.netbed import NetBed  # noqa: E402
from ipyparallel_broadcast.tools.slurmbed import SlurmBed  # noqa: E402

BROKEN = """
c.Cluster.controller_launcher_class = "broadcast-slurm"
c.Cluster.engine_launcher_class = "broadcast-slurm"
c.Cluster.controller_ip = "*"
c.BroadcastSlurmControllerLauncher.controller_cmd = ["/usr/bin/python3", "-m", "ipyparallel_broadcast.controller"]
c.BroadcastSlurmControllerLauncher.connection_info_timeout = 600
"""
ERROR_LINE = "No module named"  # that interpreter lacks the package or its dependencies


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    rows = []
    with NetBed(hosts=3) as bed, SlurmBed(bed, cpus=5) as slurm:
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            cluster = IPCluster(slurm, BROKEN).start(12)
            out = cluster.proc.communicate(timeout=900)[0]
            took = time.perf_counter() - t0
            stale = bool(glob.glob(os.path.join(cluster.security, "cluster-*.json")))
            rows.append((took, cluster.proc.returncode, ERROR_LINE in out, stale, slurm.jobs()))
            print(f"{took:.2f} s, exit {cluster.proc.returncode}", flush=True)
    lines = [
        "Seconds from launching `ipcluster start -n 12` (controller and engines by `sbatch`, the",
        "controller's command an interpreter without this package) until it exits; its exit status;",
        f"whether its output shows the job's error (`{ERROR_LINE}`); whether a cluster file is left",
        "(IPython Parallel's launchers: a 60 s timeout, a hang, and a stale file). The controller's",
        "connection timeout is set to 600 s, so an exit before it is the failure being noticed.",
        "",
        "| run | seconds to exit | exit status | the job's error shown | cluster file left | jobs left |",
        "|---:|---:|---:|---|---|---|",
    ]
    for i, (took, code, shown, stale, jobs) in enumerate(rows, 1):
        lines.append(
            f"| {i} | {took:.2f} | {code} | {'yes' if shown else 'no'} | {'yes' if stale else 'no'} | {len(jobs)} |"
        )
    lines += ["", f"Median: {statistics.median(r[0] for r in rows):.2f} s."]
    report("slurm_failure.py", argv, "A Slurm controller job that exits at once", lines, args.out)


if __name__ == "__main__":
    main()
