"""The scale page's plot: each figure of ``registration.py``'s results file
against the engine count, ours and stock IPython Parallel's controller.

    python benchmarks/scripts/plot_scale.py benchmarks/results/registration-scale.md --out docs/scale.png
"""

from __future__ import annotations

import argparse

from plot_collectives import table_rows

# (column of the results table, the plot's title, its scale): every figure the issue bounds
FIGURES = [
    ("all in (s)", "all registered, a client sees all (s)", "log"),
    ("center CPU (s)", "center CPU while registering (s)", "log"),
    ("idle (% of a core)", "idle center CPU (% of a core)", "linear"),
    ("PSS (MiB)", "center memory, PSS (MiB)", "linear"),
    ("slowest connect (ms)", "slowest client connection while registering (ms)", "log"),
    ("echo (ms)", "1 kB echo on every engine (ms)", "log"),
]


def series(path: str) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """``{controller: {column: [(engines, value)]}}`` from the file's table; rows
    of runs that did not finish are left out."""
    header, *rows = table_rows(path, skip=())
    out: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for cells in rows:
        if len(cells) != len(header) or not cells[2].replace(".", "", 1).isdigit():
            continue
        named = dict(zip(header, cells))
        engines = int(named["engines / hosts"].split()[0])
        for column, _, _ in FIGURES:
            out.setdefault(named["controller"], {}).setdefault(column, []).append((engines, float(named[column])))
    return out


def plot(data: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(12, 6.5))
    for ax, (column, title, scale) in zip(axes.flat, FIGURES):
        for controller, columns in sorted(data.items()):
            points = sorted(columns[column])
            label = "ours, behind host relays" if controller == "ours" else "stock IPython Parallel"
            ax.plot([e for e, _ in points], [v for _, v in points], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale(scale)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("simulated engines", fontsize=8)
    axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="registration.py's results file")
    parser.add_argument("--out", required=True, help="the PNG to write")
    args = parser.parse_args(argv)
    plot(series(args.results), args.out)


if __name__ == "__main__":
    main()
