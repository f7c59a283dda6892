"""Measure the costs behind ``topology.auto_shape`` and check its picks, on
simulated engines (``sim.SimEngines``) and our real relay nodes.

    python benchmarks/scripts/calibrate_shape.py --out benchmarks/results/auto-shape.md

1. Costs: at depth 1, fan-out 2, the CPU each relay node spends per coalesced
   1 kB call (its process CPU time, from the stats survey) at two engine
   counts. A leaf's CPU grows with its engines: the slope is ``engine_ms``,
   what is left at zero engines is ``hop_ms``.
2. Picks: the median round trip of every shape in a sweep, beside the model's
   figure, at each engine count; the model's pick should be at or near the
   fastest measured shape.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import report  # noqa: E402

from ipyparallel_broadcast.engine.compose.host import cpu_count  # noqa: E402
from ipyparallel_broadcast.tools.farm import farm_cluster, t_echo  # noqa: E402
from ipyparallel_broadcast.wire.topology import ENGINE_MS, HOP_MS, TreeShape, auto_shape, modelled_ms  # noqa: E402

SHAPES = [(0, 2), (1, 2), (1, 3), (1, 4), (2, 2)]


def node_cpu_per_call(n: int, calls: int) -> dict:
    """ms of CPU per call: the root's and the mean leaf's, depth 1 fan-out 2."""
    with farm_cluster("ours", n, 1, 2) as (rc, farm, hub):
        view = rc.broadcast_view(coalescing=True)
        for _ in range(3):
            t_echo(view)
        before = {s["node"]: s["cpu"] for s in rc.broadcast_stats()}
        for _ in range(calls):
            t_echo(view)
        after = {s["node"]: s["cpu"] for s in rc.broadcast_stats()}
    per = {k: 1e3 * (after[k] - before[k]) / calls for k in after}
    leaves = [v for k, v in per.items() if k != "root"]
    return dict(root=per["root"], leaf=sum(leaves) / len(leaves))


def round_trips(n: int, shapes, reps: int) -> dict:
    out = {}
    for depth, fanout in shapes:
        with farm_cluster("ours", n, depth, fanout) as (rc, farm, hub):
            view = rc.broadcast_view(coalescing=True)
            t_echo(view)
            out[(depth, fanout)] = 1e3 * statistics.median(t_echo(view) for _ in range(reps))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=64)
    parser.add_argument("--large", type=int, default=512)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--engines", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    cores = cpu_count()

    small, large = node_cpu_per_call(args.small, args.calls), node_cpu_per_call(args.large, args.calls)
    per_leaf = (args.small / 2, args.large / 2)
    engine_ms = (large["leaf"] - small["leaf"]) / (per_leaf[1] - per_leaf[0])
    hop_ms = small["leaf"] - per_leaf[0] * engine_ms
    lines = [
        f"{cores} cores; simulated engines, our relay nodes.",
        "",
        "## Costs (CPU ms per coalesced 1 kB call, depth 1, fan-out 2)",
        "",
        f"Each relay node's process CPU time, from the stats survey, over {args.calls} calls.",
        "",
        "| engines | per leaf | root | each leaf |",
        "|---:|---:|---:|---:|",
        f"| {args.small} | {per_leaf[0]:.0f} | {small['root']:.2f} | {small['leaf']:.2f} |",
        f"| {args.large} | {per_leaf[1]:.0f} | {large['root']:.2f} | {large['leaf']:.2f} |",
        "",
        f"Fit: `engine_ms` = {engine_ms:.3f} ms per engine, `hop_ms` = {hop_ms:.2f} ms per hop "
        f"(`topology` uses {ENGINE_MS} and {HOP_MS}).",
        "",
        f"## Picks (median round trip of a coalesced 1 kB call over {args.reps} calls, ms)",
        "",
        "| engines | shape | measured | modelled | pick |",
        "|---:|---|---:|---:|---|",
    ]
    verdicts = []
    for n in args.engines:
        pick = auto_shape(n, cores)
        measured = round_trips(n, SHAPES, args.reps)
        best = min(measured, key=measured.get)
        for (depth, fanout), ms in measured.items():
            shape = TreeShape(depth, fanout)
            marks = ("auto" if shape == pick else "") + (" fastest" if (depth, fanout) == best else "")
            lines.append(
                f"| {n} | d{depth} f{fanout} | {ms:.1f} | {modelled_ms(shape, n, cores):.1f} | {marks.strip()} |"
            )
        picked = measured.get((pick.depth, pick.fanout))
        if picked is None:
            lines.append(
                f"| {n} | d{pick.depth} f{pick.fanout} | - | {modelled_ms(pick, n, cores):.1f} | auto (not swept) |"
            )
            verdicts.append(f"- {n} engines: auto picks d{pick.depth} f{pick.fanout}, not swept.")
        else:
            verdicts.append(
                f"- {n} engines: auto picks d{pick.depth} f{pick.fanout} ({picked:.1f} ms), the fastest "
                f"is d{best[0]} f{best[1]} ({measured[best]:.1f} ms): auto is "
                f"{100 * (picked / measured[best] - 1):.0f}% behind; the swept shapes span "
                f"{min(measured.values()):.1f}-{max(measured.values()):.1f} ms."
            )
    lines += ["", "Auto against the sweep:", "", *verdicts]
    report("calibrate_shape.py", argv, "Tree shape 'auto': costs and picks", lines, args.out)


if __name__ == "__main__":
    main()
