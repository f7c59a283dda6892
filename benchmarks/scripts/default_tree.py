"""Which tree to ship as the default: 'auto' beside fixed shapes, on a laptop-sized
cluster and on 1,024 simulated engines, each measured over several fresh clusters.

    python benchmarks/scripts/default_tree.py --runs 5 --out benchmarks/results/default-tree.md

Two settings:

- ``laptop``: ``--engines`` real engines on this host (``ipb.Cluster``), as a
  notebook user starts them;
- ``farm``: ``--farm-engines`` simulated engines (``sim.SimEngines``) on
  ``--hosts`` simulated hosts, each behind its host relay, as a cluster of
  many hosts looks from the center.

For each shape (``auto``: depth and fan-out 'auto', the controller's pick, read
back from the tree; then each ``--shapes`` entry, ``DEPTHxFANOUT``) a fresh
cluster runs ``--calls`` 1 kB echoes to every engine in each reply mode,
interleaved, after a warm-up. A run's figure is the median of its calls; the
table gives the median over ``--runs`` runs and their spread (lowest to highest
run). Shapes take turns run by run, so drift on the machine falls on all alike.
"center CPU" is the client's and the controller's processes' CPU (every relay
node included) over the calls, per call, idle work (heartbeats) included.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from contextlib import contextmanager

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import psutil  # noqa: E402
from report import report  # noqa: E402

from ipyparallel_broadcast.engine.compose.host import cpu_count  # noqa: E402
from ipyparallel_broadcast.tools import bench  # noqa: E402
from ipyparallel_broadcast.tools.farm import farm_cluster, farm_processes  # noqa: E402
from ipyparallel_broadcast.tools.farm import t_echo as farm_echo  # noqa: E402

MODES = ("coalescing", "streaming")


def parse_shape(text: str):
    if text == "auto":
        return "auto", "auto"
    depth, fanout = text.split("x")
    return int(depth), int(fanout)


@contextmanager
def laptop(n: int, depth, fanout):
    """(client, center processes) of n real local engines."""
    with bench.our_cluster(n, depth, fanout) as (rc, cluster):
        keeper = psutil.Process(cluster.controller.process.pid)
        yield rc, [psutil.Process(), keeper, *keeper.children(recursive=True)]


@contextmanager
def farm(n: int, hosts: int, depth, fanout):
    """(client, center processes) of n simulated engines on ``hosts`` hosts."""
    sizing = [f"--BroadcastController.engines={n}", f"--BroadcastController.hosts={hosts}"]
    with farm_cluster("ours", n, depth, fanout, hosts=hosts, controller_args=sizing) as (rc, sim, controller):
        farmed = {p.pid for p in farm_processes(sim)}
        center = [controller, *controller.children(recursive=True)]
        yield rc, [psutil.Process()] + [p for p in center if p.pid not in farmed]


def one_run(cluster, calls: int, timed) -> dict:
    """Per mode: the median round trip (ms) of ``calls`` echoes, and the center's CPU per call (ms)."""
    rc, center = cluster
    tree = rc.broadcast_tree()
    views = {mode: rc.broadcast_view(coalescing=mode == "coalescing") for mode in MODES}
    for view in views.values():
        for _ in range(3):
            timed(view)
    walls = {mode: [] for mode in MODES}
    cpu0 = bench.cpu_seconds(center)
    for _ in range(calls):
        for mode, view in views.items():
            walls[mode].append(timed(view))
    cpu = (bench.cpu_seconds(center) - cpu0) / (calls * len(MODES))
    out = {mode: 1e3 * statistics.median(w) for mode, w in walls.items()}
    return dict(shape=f"depth {tree.depth}, fan-out {tree.fanout}", nodes=tree.shape.n_nodes, cpu=1e3 * cpu, **out)


def spread(values) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def table(setting: str, results: dict) -> list[str]:
    lines = [
        f"## {setting}",
        "",
        "| asked | tree | relay processes | coalesced echo (ms) | streamed echo (ms) | center CPU per call (ms) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for asked, runs in results.items():
        shapes = sorted({r["shape"] for r in runs})
        lines.append(
            f"| {asked} | {' / '.join(shapes)} | {runs[0]['nodes']} | {spread([r['coalescing'] for r in runs])} "
            f"| {spread([r['streaming'] for r in runs])} | {spread([r['cpu'] for r in runs])} |"
        )
    lines.append("")
    for measure, what in (("coalescing", "coalesced echo"), ("streaming", "streamed echo"), ("cpu", "center CPU")):
        lines.append(f"- {what}: {verdict(results, measure)}")
    return lines + [""]


def verdict(results: dict, measure: str) -> str:
    """The least median over runs, and which other shapes' spreads reach it (a tie within the spread)."""
    runs = {asked: [r[measure] for r in rs] for asked, rs in results.items()}
    best = min(runs, key=lambda k: statistics.median(runs[k]))
    ties = [k for k in runs if k != best and min(runs[k]) <= max(runs[best])]
    said = f"least median {best}"
    for other in runs:
        if other != best:
            gap = statistics.median(runs[other]) / statistics.median(runs[best]) - 1
            said += f"; {other} +{100 * gap:.0f}%" + (" (spreads overlap)" if other in ties else "")
    return said


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, default=8, help="real engines in the laptop setting")
    parser.add_argument("--farm-engines", type=int, default=1024)
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--shapes", nargs="+", default=["auto", "1x2", "2x2"])
    parser.add_argument("--settings", nargs="+", default=["laptop", "farm"], choices=["laptop", "farm"])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    lines = [__doc__.split("\n\n", 2)[2].strip(), "", f"{cpu_count()} cores."]
    for setting in args.settings:
        results = {s: [] for s in args.shapes}
        tic = time.perf_counter()
        for _ in range(args.runs):
            for asked in args.shapes:
                depth, fanout = parse_shape(asked)
                if setting == "laptop":
                    cluster, timed = laptop(args.engines, depth, fanout), bench.t_echo
                else:
                    cluster, timed = farm(args.farm_engines, args.hosts, depth, fanout), farm_echo
                with cluster as c:
                    results[asked].append(one_run(c, args.calls, timed))
        name = (
            f"laptop: {args.engines} real engines on this host"
            if setting == "laptop"
            else f"farm: {args.farm_engines} simulated engines on {args.hosts} hosts, each behind its host relay"
        )
        lines += ["", *table(f"{name}; {args.runs} runs of {args.calls} calls per mode", results)]
        sys.stderr.write(f"{setting}: {time.perf_counter() - tic:.0f} s\n")
    report("default_tree.py", argv, "Which tree to ship as the default", lines, args.out)


if __name__ == "__main__":
    main()
