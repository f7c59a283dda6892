"""The quick runner's tables on real engines, written with their command and
commit: the CPU table (client, controller, engines; ms per engine per apply of
a 1 kB echo, net of each system's idle CPU) and the latency table of a suite.

    python benchmarks/scripts/client_cpu.py --engines 16 --calls 200 --reps 5 --peers \
        --out benchmarks/results/client-cpu-n16.md
    python benchmarks/scripts/client_cpu.py --suite collectives --engines 8 --depth 2 --calls 0 --reps 9 \
        --out benchmarks/results/collectives-n8-depth2.md
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import report  # noqa: E402

from ipyparallel_broadcast.tools import bench  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, nargs="+", default=[16])
    parser.add_argument("--depth", type=int, default=1)
    parser.add_argument("--calls", type=int, default=200, help="echo calls per view for the CPU table")
    parser.add_argument("--reps", type=int, default=5, help="interleaved rounds of the latency table")
    parser.add_argument("--suite", choices=sorted(bench.SUITES), default="calls")
    parser.add_argument("--peers", action="store_true", help="Dask (and MPI, if installed) too")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    if args.peers and args.suite != "calls":
        parser.error("--peers goes with the calls suite")
    lines = []

    def out(text):
        print(text, flush=True)
        lines.extend(["```", text.rstrip(), "```", ""])

    bench.run(
        args.engines, args.depth, args.reps, out=out, cpu_calls=args.calls, suite=args.suite, with_peers=args.peers
    )
    title = "CPU per engine per apply, real engines" if args.calls else f"The {args.suite} suite, real engines"
    report("client_cpu.py", argv, title, lines, args.out)


if __name__ == "__main__":
    main()
