"""Across hosts on the NetBed (network namespaces on a bridge; needs root).

    python benchmarks/scripts/multihost.py --hosts 3 --per-host 3 --push-mb 4
    python benchmarks/scripts/multihost.py --hosts 8 --per-host 8 --push-mb 1 --rate 1gbit
    python benchmarks/scripts/multihost.py --hosts 8 --per-host 8 --push-mb 1 --rate 1gbit --engines sim

For each layout, a fresh cluster on a fresh bed:
- ``host relays``: our engines, each host's engines behind its relay (the default);
- ``controller-side tree``: the same, with ``--BroadcastEngine.host_relay=never``
  (engines connect to the leaves on the controller host, as before host relays).
Each measures: bytes into each engine host per push (our BroadcastView and
DirectView), the push's wall time, and the coalesced echo round trip, as
medians of ``--reps`` interleaved repetitions. ``--rate`` limits every link,
the controller's too, with ``tc tbf``. The report starts with the command and
the commit; ``--out`` writes it under benchmarks/results/.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import psutil
from report import report

from ipyparallel_broadcast.tools.bedcluster import BedCluster
from ipyparallel_broadcast.tools.bench import cpu_seconds
from ipyparallel_broadcast.tools.netbed import NetBed

LAYOUTS = {"host relays": [], "controller-side tree": ["--BroadcastEngine.host_relay=never"]}


def processes(pids) -> list:
    """The live ones of ``pids``, to read their CPU (``bench.cpu_seconds``)."""
    out = []
    for pid in pids:
        try:
            out.append(psutil.Process(pid))
        except psutil.Error:
            pass
    return out


def measure(layout, args) -> dict:
    n = args.hosts * args.per_host
    data = np.zeros(int(args.push_mb * 2**20), dtype=np.uint8)
    with NetBed(hosts=args.hosts) as bed, BedCluster(bed, depth=args.depth, fanout=args.fanout) as cluster:
        if args.rate:
            for host in [bed.controller] + bed.hosts:
                bed.limit(host, args.rate)
        for host in bed.hosts:
            if args.engines == "sim":
                cluster.start_sim(host, args.per_host, host_relay=layout == "host relays")
            else:
                cluster.start_engines(host, args.per_host, args=LAYOUTS[layout])
        rc = cluster.client(wait_for=n, timeout=max(120, n))
        views = {"ours (coalescing)": rc.broadcast_view(), "DirectView": rc[:]}
        for view in views.values():  # warm up: imports, connections
            view.apply_sync(lambda: 0)
        out = {name: dict(bytes=[], push=[], echo=[], center=[], hosts=[], client=[]) for name in views}
        echo = np.zeros(1024, dtype=np.uint8)
        center = processes(bed.pids(bed.controller))
        hosts = processes(p for h in bed.hosts for p in bed.pids(h))
        for _ in range(args.reps):
            for name, view in views.items():
                before = [bed.link_bytes(h)[0] for h in bed.hosts]
                tic = time.perf_counter()
                view.push(dict(data=data), block=True)
                out[name]["push"].append(time.perf_counter() - tic)
                out[name]["bytes"].append(max(bed.link_bytes(h)[0] - b for h, b in zip(bed.hosts, before)))
                cpu = cpu_seconds(center), cpu_seconds(hosts), time.process_time()
                tic = time.perf_counter()
                view.apply_sync(lambda x: x, echo)
                out[name]["echo"].append(time.perf_counter() - tic)
                for key, was, now in zip(
                    ("center", "hosts", "client"), cpu, (cpu_seconds(center), cpu_seconds(hosts), time.process_time())
                ):
                    out[name][key].append(now - was)
        # CPU: a mean over the rounds; times: medians
        return {
            name: {
                k: (statistics.mean if k in ("center", "hosts", "client") else statistics.median)(v)
                for k, v in m.items()
            }
            for name, m in out.items()
        }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--per-host", type=int, default=3)
    parser.add_argument("--push-mb", type=float, default=4)
    parser.add_argument("--rate", default=None, help="tbf rate of every link, e.g. 1gbit")
    parser.add_argument("--depth", type=int, default=1)
    parser.add_argument("--fanout", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--engines", choices=["real", "sim"], default="real")
    parser.add_argument("--out", default=None, help="write the report to this file too")
    args = parser.parse_args(argv)
    why = NetBed.available()
    if why:
        parser.error(why)
    results = {layout: measure(layout, args) for layout in LAYOUTS}
    n = args.hosts * args.per_host
    lines = [
        f"NetBed (network namespaces, one core pair for everything); "
        f"{'simulated engines (SimEngines)' if args.engines == 'sim' else 'real engines'}; tree depth {args.depth}, "
        f"fan-out {args.fanout}; links {args.rate or 'unlimited'}; times are medians of {args.reps} "
        f"rounds, CPU (all processes of the controller's host, all of the engine hosts', the client's) means.",
        "",
        "| layout | view | MB into the busiest host per push | push (ms) | 1 kB echo (ms) "
        "| CPU per echo: controller host (ms) | engine hosts (ms) | client (ms) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for layout, views in results.items():
        for view, m in views.items():
            if view == "DirectView" and layout != "host relays":
                continue  # DirectView does not use the tree: measured once
            lines.append(
                f"| {layout} | {view} | {m['bytes'] / 1e6:.2f} | {m['push'] * 1e3:.0f} | "
                f"{m['echo'] * 1e3:.1f} | {m['center'] * 1e3:.0f} | {m['hosts'] * 1e3:.0f} | "
                f"{m['client'] * 1e3:.0f} |"
            )
    ours = results["host relays"]["ours (coalescing)"]
    for name, other in (
        ("the controller-side tree", results["controller-side tree"]["ours (coalescing)"]),
        ("DirectView", results["host relays"]["DirectView"]),
    ):
        lines.append(
            f"\nAgainst {name}: push, its time over the host relays' {other['push'] / ours['push']:.1f}x; "
            f"echo, the host relays' time over its {ours['echo'] / other['echo']:.2f}x."
        )
    report(
        "multihost.py",
        argv,
        f"Across hosts: {n} engines on {args.hosts} hosts, {args.push_mb:g} MB push",
        lines,
        args.out,
    )


if __name__ == "__main__":
    main()
