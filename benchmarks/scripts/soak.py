"""Memory soak: many broadcasts, the RSS of every controller-side process over time.

    python benchmarks/scripts/soak.py --engines 7 --depth 1 --calls 100000 --out FILE [--plot PNG]

Rounds of ``--round`` calls cycle through the reply modes (coalescing,
streaming, batches of 4) and two patterns: a *burst* (all of a round's calls
sent at once, then awaited) and *steady* (a window of ``--window`` calls in
flight, one sent as each completes). After each round the RSS of the hub
(the controller process), of every relay node and of the client is sampled.
The report gives each process's RSS at the start, the middle and the end,
the slope of a least-squares line over the second half (MB per 10,000
calls), and the growth between the means of the first and the last whole
cycle of rounds in the second half (MB per 100,000 calls; a burst peaks
higher than a steady round, so means of whole cycles compare like with
like): a process whose memory is bounded has about 0 in both. RSS also
moves with the C allocator's arenas and zmq's buffers, so the relay nodes'
and the client's Python heap (``sys.getallocatedblocks``, from the stats
survey) is reported too: a leak of Python objects shows there.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import os
import sys
import time

import numpy as np
import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import report  # noqa: E402

import ipyparallel_broadcast as ipb  # noqa: E402
from ipyparallel_broadcast.tools.bench import our_cluster  # noqa: E402

MODES = {"coalescing": True, "streaming": False, "batch 4": ipb.Batch(4)}
PATTERNS = ("burst", "steady")
MB = 2**20


def echo(x):
    return x


def burst(view, n, payload):
    ars = [view.apply_async(echo, payload) for _ in range(n)]
    for ar in ars:
        ar.get(timeout=300)


def steady(view, n, payload, window):
    inflight = collections.deque()
    for _ in range(n):
        if len(inflight) >= window:
            inflight.popleft().get(timeout=300)
        inflight.append(view.apply_async(echo, payload))
    for ar in inflight:
        ar.get(timeout=300)


def heap_blocks(rc) -> dict:
    """name -> Python heap blocks of every relay node (stats survey) and of the client."""
    out = {f"node {n['node']}": n["blocks"] for n in sorted(rc.broadcast_stats(), key=lambda n: n["node"])}
    out["client"] = sys.getallocatedblocks()
    return out


def processes(rc, cluster) -> dict:
    """name -> psutil.Process: the hub (controller process), the relay nodes, the client."""
    out = {"hub": psutil.Process(cluster.controller.process.pid)}
    for node in sorted(rc.broadcast_stats(), key=lambda n: n["node"]):
        out[f"node {node['node']}"] = psutil.Process(node["pid"])
    out["client"] = psutil.Process()
    return out


def slope_per_10k(calls, values, unit=MB) -> float:
    """Units per 10,000 calls of a least-squares line through the second half."""
    half = len(calls) // 2
    x, y = np.array(calls[half:], float), np.array(values[half:], float)
    return float(np.polyfit(x, y, 1)[0] * 10_000 / unit) if len(x) > 1 else float("nan")


def cycle_growth_per_100k(calls, values, cycle, unit=MB) -> float:
    """Units per 100,000 calls between the mean over the first whole cycle of
    rounds after the middle and the mean over the last whole cycle: bursts and
    steady rounds peak differently, and a cycle's mean compares like with like."""
    n = len(values) - 1  # samples after rounds (the first is before any call)
    last = 1 + (n // cycle - 1) * cycle
    first = 1 + ((n // 2) // cycle) * cycle
    if last <= first:
        return float("nan")
    mean = lambda i: float(np.mean(values[i : i + cycle]))  # noqa: E731
    return (mean(last) - mean(first)) / unit * 100_000 / (calls[last] - calls[first])


def sample(rc, procs, samples, blocks):
    for name, proc in procs.items():
        samples[name].append(proc.memory_info().rss)
    for name, n in heap_blocks(rc).items():
        blocks[name].append(n)


def plot(calls, samples, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, rss in samples.items():
        ax.plot(np.array(calls) / 1000, np.array(rss) / MB, label=name)
    ax.axvline(calls[len(calls) // 2] / 1000, color="grey", lw=0.8, ls="--")
    ax.set(xlabel="broadcasts (thousands)", ylabel="RSS (MB)", title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, default=7)
    parser.add_argument("--depth", type=int, default=1)
    parser.add_argument("--fanout", type=int, default=2)
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--round", type=int, default=2000, help="calls per round (one RSS sample each)")
    parser.add_argument("--window", type=int, default=8, help="calls in flight in the steady pattern")
    parser.add_argument(
        "--digest-history",
        type=int,
        default=None,
        help="Session.digest_history_size of the controller and its nodes (default: the Session's)",
    )
    parser.add_argument(
        "--heap-trim",
        type=float,
        default=None,
        help="BroadcastController.heap_trim_interval in seconds (0: never; default: the controller's)",
    )
    parser.add_argument(
        "--client-heap-trim",
        type=float,
        default=None,
        help="the client's Client.heap_trim_interval in seconds (default: the client's, 0: never)",
    )
    parser.add_argument("--out", default=None)
    parser.add_argument("--plot", default=None, help="PNG of RSS over calls")
    args = parser.parse_args(argv)
    payload = np.ones(128)  # 1 kB
    rounds = itertools.cycle(itertools.product(PATTERNS, MODES))
    calls, samples, blocks = [0], collections.defaultdict(list), collections.defaultdict(list)
    t0 = time.monotonic()
    options = {}
    controller_args = []
    if args.digest_history:
        controller_args.append(f"--Session.digest_history_size={args.digest_history}")
    if args.heap_trim is not None:
        controller_args.append(f"--BroadcastController.heap_trim_interval={args.heap_trim}")
    if controller_args:
        options["controller_args"] = controller_args
    with our_cluster(args.engines, args.depth, args.fanout, **options) as (rc, cluster):
        if args.client_heap_trim is not None:
            rc.heap_trim_interval = args.client_heap_trim
        procs = processes(rc, cluster)
        sample(rc, procs, samples, blocks)
        while calls[-1] < args.calls:
            pattern, mode = next(rounds)
            view = rc.broadcast_view(coalescing=MODES[mode])
            n = min(args.round, args.calls - calls[-1])
            if pattern == "burst":
                burst(view, n, payload)
            else:
                steady(view, n, payload, args.window)
            calls.append(calls[-1] + n)
            sample(rc, procs, samples, blocks)
            print(
                f"{calls[-1]:>7} calls ({pattern}, {mode}), {time.monotonic() - t0:6.0f} s: "
                + ", ".join(f"{k} {v[-1] / MB:.0f}" for k, v in samples.items()),
                flush=True,
            )
        stats = {n["node"]: n for n in rc.broadcast_stats()}
        trimmer = rc._heap_trims.trimmer
        trim_interval, trims, longest = rc.heap_trim_interval, trimmer.trims, trimmer.longest
    title = (
        f"{args.calls:,} broadcasts, {args.engines} engines, depth {args.depth}: "
        "RSS of the controller's processes and the client"
    )
    mid = len(calls) // 2
    lines = [
        f"{args.engines} engines, depth {args.depth}, fan-out {args.fanout}, {os.cpu_count()} cores; "
        f"1 kB echoes in rounds of {args.round:,} calls cycling through {', '.join(PATTERNS)} "
        f"(window {args.window}) x {', '.join(MODES)}; {time.monotonic() - t0:.0f} s in all.",
        "",
        "| process | RSS at start (MB) | at the middle | at the end | slope over the 2nd half (MB per 10k calls) "
        "| growth over the 2nd half, cycle means (MB per 100k calls) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    cycle = len(PATTERNS) * len(MODES)
    for name, rss in samples.items():
        lines.append(
            f"| {name} | {rss[0] / MB:.1f} | {rss[mid] / MB:.1f} | {rss[-1] / MB:.1f} "
            f"| {slope_per_10k(calls, rss):+.2f} | {cycle_growth_per_100k(calls, rss, cycle):+.1f} |"
        )
    lines += [
        "",
        "Python heap, in thousands of blocks (`sys.getallocatedblocks()`):",
        "",
        "| process | at start | at the middle | at the end | slope over the 2nd half (thousand blocks per 10k calls) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, n in blocks.items():
        lines.append(
            f"| {name} | {n[0] / 1e3:.1f} | {n[mid] / 1e3:.1f} | {n[-1] / 1e3:.1f} "
            f"| {slope_per_10k(calls, n, 1e3):+.2f} |"
        )
    lines += [
        "",
        "Pending requests at the end (every node must be 0): "
        + ", ".join(f"node {k}: {v.get('pending')}" for k, v in sorted(stats.items())),
        "",
        "Signatures held against replays at the end (bounded by `Session.digest_history_size`): "
        + ", ".join(f"node {k}: {v.get('signatures'):,}" for k, v in sorted(stats.items())),
        "",
        f"The client's heap trims (`Client.heap_trim_interval` {trim_interval:g} s): {trims}, "
        f"the longest {1e3 * longest:.1f} ms.",
        "",
        "Every sample (MB):",
        "",
        "| calls | " + " | ".join(samples) + " |",
        "|---:|" + "---:|" * len(samples),
    ]
    for i, c in enumerate(calls):
        lines.append(f"| {c} | " + " | ".join(f"{rss[i] / MB:.1f}" for rss in samples.values()) + " |")
    if args.plot:
        plot(calls, samples, args.plot, title)
        lines += ["", f"Plot: `{args.plot}`."]
    report("soak.py", argv, f"Memory soak: {args.calls:,} broadcasts", lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
