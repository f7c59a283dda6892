"""``ipcluster start`` under a real Slurm across the multi-host bed, ours beside
stock IPython Parallel: seconds until every engine has registered.

    python benchmarks/scripts/slurm_start.py --repeat 3 --out benchmarks/results/slurm-start-12.md

A ``NetBed`` of 3 engine hosts and a controller host, a ``SlurmBed`` on it
(slurmctld on the controller host, a slurmd per engine host), and for each
way, ``--repeat`` times: ``ipcluster start -n 12`` on the controller host,
timed from launching it until a client sees all 12 engines registered; then
``ipcluster stop`` and a wait until no job or process is left. Needs root and
Debian's ``slurm-wlm`` and ``munge``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ipyparallel as ipp  # noqa: E402
from report import report  # noqa: E402

import ipyparallel_broadcast as ipb  # noqa: E402
from ipyparallel_broadcast.tools.bedcluster import IPCluster
from ipyparallel_broadcast.tools.netbed import NetBed  # noqa: E402
from ipyparallel_broadcast.tools.slurmbed import SlurmBed  # noqa: E402

PER_NODE, NODES = 4, 3
TEMPLATE = """#!/bin/sh
#SBATCH --job-name=ipengine-{{cluster_id}}
#SBATCH --ntasks={{n}}
#SBATCH --ntasks-per-node={per_node}
#SBATCH --output={{output_file}}
#SBATCH --export=ALL
srun {{program_and_args}}
"""

STOCK_CONTROLLER = """#!/bin/sh
#SBATCH --ntasks=1
#SBATCH --nodelist=h1
#SBATCH --output={output_file}
{program_and_args}
"""

STOCK_ENGINES = """
c.SlurmEngineSetLauncher.engine_cmd = [{python!r}, "-m", "ipyparallel.engine"]
c.SlurmEngineSetLauncher.batch_template = {template!r}
"""
STOCK_CONTROLLER_JOB = """
c.Cluster.controller_location = "{first}"
c.SlurmControllerLauncher.controller_cmd = [{python!r}, "-m", "ipyparallel.controller"]
c.SlurmControllerLauncher.batch_template = {controller_template!r}
"""
OUR_ENGINES = "c.BroadcastSlurmEngineSetLauncher.batch_template = {template!r}\n"


def config(controller: str, engines: str, ip: str, rest: str) -> str:
    """An ipcluster_config.py (``str.format`` fields: the bed's values)."""
    head = f"c.Cluster.controller_launcher_class = {controller!r}\nc.Cluster.engine_launcher_class = {engines!r}\n"
    return head + f'c.Cluster.controller_ip = "{ip}"\n' + rest


# controller local on the controller host, or a Slurm job too
WAYS = {
    "ours: engines by sbatch": config("broadcast", "broadcast-slurm", "{addr}", OUR_ENGINES),
    "stock: engines by sbatch": config("local", "slurm", "{addr}", STOCK_ENGINES),
    "ours: controller and engines by sbatch": config("broadcast-slurm", "broadcast-slurm", "*", OUR_ENGINES),
    "stock: controller and engines by sbatch": config("slurm", "slurm", "*", STOCK_CONTROLLER_JOB + STOCK_ENGINES),
}
EXPLAINED = """Seconds from launching `ipcluster start -n {n}` on the controller host until a client
there sees {n} engines registered: the controller's start, `sbatch`, Slurm's scheduling
and `srun`, the engines' imports and registration ({per_node} engines on each of {nodes} Slurm
nodes, one per bed host, all on this machine's {cores} cores). Ours: the `broadcast` and
`broadcast-slurm` launchers, our controller (depth 1 or 'auto') and engines (each engine
host's first engine starts its host relay). Stock: IPython Parallel's `local`/`slurm`
launchers, `ipcontroller` and `ipengine`; its controller job is placed on h1 and its
location given (`--location`), since the bed's hostname resolves to loopback (ours finds
its address itself). Median of {repeat}, then each run."""


def measure(slurm, config: str, n: int, hung: list) -> float:
    shm_before = set(os.listdir("/dev/shm"))
    t0 = time.perf_counter()
    cluster = IPCluster(slurm, config).start(n)
    try:
        path = cluster.connection_file()
        rc = ipp.Client(path)
        try:
            rc.wait_for_engines(n, timeout=180)
            took = time.perf_counter() - t0
        finally:
            rc.close()
    finally:
        cluster.stop(terminate_after=20)
        hung.append(cluster.terminated)
    left = cluster.left_behind(shm_before)
    if left:
        raise RuntimeError(f"left behind: {left}")
    return took


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    n = PER_NODE * NODES
    times = {label: [] for label in WAYS}
    hung = {label: [] for label in WAYS}
    with NetBed(hosts=NODES) as bed, SlurmBed(bed, cpus=PER_NODE + 1) as slurm:
        values = dict(
            addr=bed.controller.addr,
            first=bed.hosts[0].addr,
            python=sys.executable,
            template=TEMPLATE.format(per_node=PER_NODE),
            controller_template=STOCK_CONTROLLER,
        )
        for _ in range(args.repeat):  # interleaved: drift hits every way alike
            for label, config in WAYS.items():
                times[label].append(measure(slurm, config.format(**values), n, hung[label]))
                print(f"{label}: {times[label][-1]:.2f} s", flush=True)
    lines = [
        EXPLAINED.format(n=n, per_node=PER_NODE, nodes=NODES, cores=os.cpu_count(), repeat=args.repeat),
        "",
        "| way | median (s) | runs (s) | `ipcluster start` exited after `ipcluster stop` |",
        "|---|---:|---|---|",
    ]
    for label, runs in times.items():
        exited = "no: SIGTERM after 20 s" if any(hung[label]) else "yes"
        lines.append(f"| {label} | {statistics.median(runs):.2f} | {', '.join(f'{t:.2f}' for t in runs)} | {exited} |")
    lines += ["", f"ipyparallel {ipp.__version__}, ipyparallel-broadcast {ipb.__version__}, Slurm 22.05 (Debian)."]
    report("slurm_start.py", argv, f"ipcluster start under Slurm: {n} engines on {NODES} nodes", lines, args.out)


if __name__ == "__main__":
    main()
