"""Predicted broadcast times between hosts, from the alpha-beta model
(``ipyparallel_broadcast.relay.dataplane.model``), in multiples of the wire floor M/B;
with ``--collectives``, reduce and allreduce, in multiples of their lower bounds.

    python benchmarks/scripts/model_predict.py --alpha 2e-4 --rate 10e9 --mib 1024 \\
        --out benchmarks/results/model-1g-10gbit.md
    python benchmarks/scripts/model_predict.py --collectives --alpha 2e-4 --rate 10e9 --mib 1024 \\
        --out benchmarks/results/model-collectives-1g-10gbit.md

``--alpha`` is the cost of one message at one hop (latency plus a relay's
work on it), as measured on the bed; ``--rate`` the link's bits per second.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import report  # noqa: E402

from ipyparallel_broadcast.relay.dataplane.chunks import count  # noqa: E402
from ipyparallel_broadcast.relay.dataplane.model import (  # noqa: E402
    Link,
    estimate,
    mpi_bounds,
    predict,
    predict_collectives,
)
from ipyparallel_broadcast.relay.dataplane.pushplan import plan_push  # noqa: E402
from ipyparallel_broadcast.relay.dataplane.reduce_trees import choose  # noqa: E402

FAMILIES = ("star", "tree", "pipelined tree", "two trees")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alpha", type=float, default=2e-4, help="seconds per message per hop")
    parser.add_argument("--rate", type=float, default=10e9, help="link bits per second")
    parser.add_argument("--mib", type=float, default=1024)
    parser.add_argument("--hosts", default="100,1000,10000")
    parser.add_argument("--collectives", action="store_true", help="reduce and allreduce instead of broadcasts")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    link = Link.of(args.alpha, args.rate)
    m = args.mib * 2**20
    if args.collectives:
        return collectives(args, argv, link, m)
    rows = predict([int(h) for h in args.hosts.split(",")], m, link)
    lines = [
        f"alpha = {args.alpha * 1e3:g} ms per message per hop; links {args.rate / 1e9:g} Gbit/s; "
        f"M = {args.mib:g} MiB; floor M/B = {m * link.beta:.3f} s. Each family's best shape and chunk "
        "count (1: whole messages); times in floors.",
        "",
        "| hosts | " + " | ".join(FAMILIES) + " | MPI lower bound | MPICH scatter + allgather | ours | ours x bound |",
        "|---:|" + "---|" * len(FAMILIES) + "---:|---:|---|---:|",
    ]
    for row in rows:
        cells = [f"{row[f][0]:.2f} ({row[f][1]}, {row[f][2]} chunks)" for f in FAMILIES]
        lines.append(
            f"| {row['hosts']} | "
            + " | ".join(cells)
            + f" | {row['lower bound']:.2f} | {row['MPICH scatter + allgather']:.2f} | {ours(row['hosts'], m, link)} |"
        )
    lines += [
        "",
        "Ours: the push's plan (``pushplan.plan_push``) on this link: its shape and chunk size (whole multiples of "
        "64 KiB, at most 4 MiB), and its time, with its chunk count, in floors and in multiples of the lower bound.",
    ]
    report("model_predict.py", argv, f"Modelled broadcasts of {args.mib:g} MiB between hosts", lines, args.out)


def ours(hosts: int, m: float, link: Link) -> str:
    plan = plan_push(hosts, int(m), link)
    chunks = count(int(m), plan.chunk)
    shape = "pipelined tree" if plan.shape != "two trees" else "two trees"
    e = estimate(shape, hosts, m, link, plan.fanout, max_chunks=chunks).seconds
    floor, bound = m * link.beta, mpi_bounds(hosts, m, link)["lower bound"]
    return f"{e / floor:.2f} ({plan.shape}, {chunks} chunks of {plan.chunk >> 10} KiB) | {e / bound:.2f}"


def collectives(args, argv, link, m):
    rows = predict_collectives([int(h) for h in args.hosts.split(",")], m, link)
    for row in rows:  # the way the product picks for a reduce (``uplinks.choose``) and the allreduce's ring
        shape = choose(row["hosts"])
        row["reduce: ours"] = f"{row[f'reduce: {shape}']:.2f} ({shape})"
        row["allreduce: ours"] = f"{row['allreduce: ring']:.2f} (ring)"
    keys = [k for k in rows[0] if k != "hosts"]
    lines = [
        f"alpha = {args.alpha * 1e3:g} ms per message per hop; links {args.rate / 1e9:g} Gbit/s; "
        f"M = {args.mib:g} MiB; floor M/B = {m * link.beta:.3f} s. Times in multiples of each collective's "
        "lower bound (reduce: ceil(log2 P) alpha + M beta; allreduce: ceil(log2 P) alpha + 2 (P-1)/P M beta). "
        "The product runs, for a reduce, a chain, or two trees once the model puts them 1.5 times ahead "
        "of a chain (uplinks.choose: from about 60 hosts); for an allreduce, the ring of hosts ('ours').",
        "",
        "| hosts | " + " | ".join(keys) + " |",
        "|---:|" + "---:|" * len(keys),
    ]
    for row in rows:
        lines.append(
            f"| {row['hosts']} | "
            + " | ".join(row[k] if isinstance(row[k], str) else f"{row[k]:.2f}" for k in keys)
            + " |"
        )
    report(
        "model_predict.py", argv, f"Modelled reduce and allreduce of {args.mib:g} MiB between hosts", lines, args.out
    )


if __name__ == "__main__":
    main()
