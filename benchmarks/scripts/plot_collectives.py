"""The collectives page's plot: reduce, allreduce and gather of 16 MiB on the
8-host bed, in multiples of the wire floor, ours beside DirectView, IPython Parallel's BroadcastView and MPICH,
read from the results files those runs wrote.

    python benchmarks/scripts/plot_collectives.py \\
        --ours benchmarks/results/reduce-bed-8x4-200mbit.md \\
        --mpi benchmarks/results/mpi-bed-8x4-200mbit.md --out docs/collectives-bed.png
"""

from __future__ import annotations

import argparse
import re


def table_rows(path: str, skip=("view", "ranks per host")) -> list[list[str]]:
    """The cells of every table row of a results file (rules left out, and
    headers: rows whose first cell is in ``skip``)."""
    rows = []
    for line in open(path):
        if line.startswith("|") and not re.match(r"\|[-:| ]+\|\s*$", line):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return [r for r in rows if r[0] not in skip]


def ours_and_directview(path: str, mib: int = 16) -> dict[str, dict[str, float]]:
    """``{view: {call: floors}}`` from ``reduce_bed.py``'s file (the default tree, DirectView,
    and IPython Parallel's BroadcastView if it was run)."""
    out: dict[str, dict[str, float]] = {}
    for view, call, m, _, _, floors, _ in table_rows(path):
        if m != f"{mib} MiB" or view not in ("ours, depth 1", "DirectView", "ipp BroadcastView"):
            continue
        name = "ours (default tree)" if view.startswith("ours") else view
        out.setdefault(name, {})[call.split(" ")[0]] = float(floors)
    return out


def mpich(path: str) -> dict[str, dict[str, float]]:
    """``{label: {call: floors}}`` from ``mpi_bed.py``'s file."""
    calls = {"Reduce": "reduce", "Allreduce": "allreduce", "Gather": "gather"}
    out: dict[str, dict[str, float]] = {}
    for per_host, _, op, _, _, floors, _ in table_rows(path):
        if op in calls:
            out.setdefault(f"MPICH, {per_host} rank(s) per host", {})[calls[op]] = float(floors)
    return out


def plot(series: dict[str, dict[str, float]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    calls = ["reduce", "allreduce", "gather"]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(series)
    for i, (name, values) in enumerate(series.items()):
        xs = [j + i * width for j in range(len(calls))]
        ax.bar(xs, [values.get(c, 0) for c in calls], width, label=name)
    ax.set_yscale("log")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(calls))], calls)
    ax.set_ylabel("time, in wire floors (M/B), log scale")
    ax.set_title("8 hosts x 4 engines, 200 Mbit/s links, 16 MiB per engine (gather: in all)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ours", required=True, help="reduce_bed.py's results file")
    parser.add_argument("--mpi", required=True, help="mpi_bed.py's results file")
    parser.add_argument("--out", required=True, help="the PNG to write")
    args = parser.parse_args(argv)
    plot({**ours_and_directview(args.ours), **mpich(args.mpi)}, args.out)


if __name__ == "__main__":
    main()
