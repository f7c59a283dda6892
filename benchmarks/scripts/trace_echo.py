"""Per-hop trace of a 1 kB echo on a local cluster: where the time of one call goes.

    python benchmarks/scripts/trace_echo.py --engines 4 --depth 1 --calls 20 --out FILE

Warms the cluster up, traces ``--calls`` echoes and reports the median span
of each place (ms since the client sent the request), then the timeline of
the call whose round trip is that median.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import report  # noqa: E402

from ipyparallel_broadcast.client.display import trace  # noqa: E402
from ipyparallel_broadcast.tools.bench import our_cluster  # noqa: E402


def echo(x):
    return x


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, default=4)
    parser.add_argument("--depth", type=int, default=1)
    parser.add_argument("--fanout", type=int, default=2)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    payload = np.ones(128)  # 1 kB
    with our_cluster(args.engines, args.depth, args.fanout) as (rc, _):
        view = rc.broadcast_view()
        for _ in range(20):
            view.apply_sync(echo, payload)  # warm: imports, connections
        runs = []
        with view.temp_flags(trace=True):
            for _ in range(args.calls):
                ar = view.apply_async(echo, payload)
                ar.get(timeout=60)
                events = ar.trace
                runs.append((trace.spans(events), events))
    places = list(runs[0][0])
    total = [max(last for _, last in spans.values()) for spans, _ in runs]
    median_run = sorted(range(len(runs)), key=total.__getitem__)[len(runs) // 2]
    lines = [
        f"{args.engines} engines, depth {args.depth}, fan-out {args.fanout}, {os.cpu_count()} cores; "
        f"{args.calls} traced echoes of 1 kB after 20 untraced.",
        "",
        "Median over the calls of each place's first and last event, ms since the client sent:",
        "",
        "| place | first (ms) | last (ms) |",
        "|---|---:|---:|",
    ]
    for place in places:
        firsts = [spans[place][0] for spans, _ in runs if place in spans]
        lasts = [spans[place][1] for spans, _ in runs if place in spans]
        lines.append(f"| {place} | {statistics.median(firsts):.2f} | {statistics.median(lasts):.2f} |")
    lines += [
        "",
        f"Round trip: median {statistics.median(total):.2f} ms, min {min(total):.2f}, max {max(total):.2f}.",
        "",
        "The timeline of the median call:",
        "",
        "```",
        trace.timeline(runs[median_run][1]),
        "```",
    ]
    report("trace_echo.py", argv, "A traced 1 kB echo, hop by hop", lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
