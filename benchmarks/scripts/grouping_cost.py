"""What grouping outputs and errors by equality costs at the client.

    python benchmarks/scripts/grouping_cost.py --engines 64 512 4096 --out benchmarks/results/grouping-cost.md

For each engine count: the per-engine stdout of a call (one text on every
engine, or a few distinct ones), grouped (``grouping.groups``) and shown
(``repr`` of ``Outputs``), and a ``GroupedCompositeError`` of one error per
engine rendered (``render_traceback``), in microseconds per engine, median of
``--reps``. This is the work the tree would save the client if leaves grouped
as they coalesce, against the work the client already does per engine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import report  # noqa: E402

from ipyparallel_broadcast.client.display import grouping as G  # noqa: E402

TRACEBACK = "".join(f'  File "<cell>", line {i}, in f\n    step_{i}()\n' for i in range(8))


def per_engine_us(fn, n: int, reps: int) -> float:
    times = []
    for _ in range(reps):
        tic = time.perf_counter()
        fn()
        times.append(time.perf_counter() - tic)
    return 1e6 * statistics.median(times) / n


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, nargs="+", default=[64, 512, 4096])
    parser.add_argument("--reps", type=int, default=21)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    lines = [
        f"Microseconds per engine, median of {args.reps}; the client's own work per engine on a "
        "broadcast echo is ~70 us (`client-cpu-n16.md`).",
        "",
        "| engines | outputs | group stdout | repr(ar.stdout) | render one error x N |",
        "|---:|---|---:|---:|---:|",
    ]
    for n in args.engines:
        eids = list(range(n))
        for kind, texts in (("1 distinct", ["done\n"] * n), ("8 distinct", [f"step {i % 8} done\n" for i in range(n)])):
            out = G.Outputs(texts, eids)
            elist = [
                (
                    "ZeroDivisionError",
                    "division by zero",
                    TRACEBACK + "ZeroDivisionError: division by zero",
                    dict(engine_id=e, method="apply"),
                )
                for e in eids
            ]
            err = G.GroupedCompositeError("one or more exceptions raised in: apply", elist)
            lines.append(
                f"| {n} | {kind} | {per_engine_us(out.groups, n, args.reps):.2f} "
                f"| {per_engine_us(lambda out=out: repr(out), n, args.reps):.2f} "
                f"| {per_engine_us(err.render_traceback, n, args.reps):.2f} |"
            )
    report("grouping_cost.py", argv, "Grouping outputs and errors at the client", lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
