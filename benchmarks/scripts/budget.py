"""Where a call's CPU goes, by process role, from 16 to 4,096 engines.

    python benchmarks/scripts/budget.py --engines 16 256 1024 4096 --out benchmarks/results/budget.md

For each engine count N, N simulated engines (``sim.SimEngines``) run as up
to ``--hosts`` simulated hosts, each behind its own host relay, under our
controller (depth 1, fan-out 2). Per call, net of each process's idle rate:
the client, the root relay node, the other relay nodes, the host relays, the
rest of the controller (hub, mux, heartbeats) and the simulated engines (a
stand-in that costs far less than a real engine: see ``client-cpu-n16.md``
for real engines). Each process's CPU is read on its own clock, in ns
(``bench.cpu_seconds``). Calls: a
1 kB echo coalesced and streamed, a 1 MiB push (coalesced), and a gather of
``--gather-bytes`` from every engine (a farm whose engines all answer that
much). The file starts with its command and commit.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from center import Meter  # noqa: E402
from report import report  # noqa: E402

from ipyparallel_broadcast.tools.farm import IDLE_WINDOW_S, farm_cluster, t_echo  # noqa: E402

PUSH = np.ones(1 << 17)  # 1 MiB
COLS = ["client", "root relay", "other relays", "host relays", "rest of controller", "engines (sim)"]


def groups(rc, controller: psutil.Process, farm) -> dict:
    nodes = {n["node"]: n["pid"] for n in rc.broadcast_stats()}
    children = controller.children(recursive=True)
    sims = [psutil.Process(p.pid) for p, _, _ in farm.processes]
    return {
        "client": [psutil.Process()],
        "root relay": [p for p in children if p.pid == nodes["root"]],
        "other relays": [p for p in children if p.pid in set(nodes.values()) - {nodes["root"]}],
        "host relays": [c for s in sims for c in s.children(recursive=True)],
        "rest of controller": [controller] + [p for p in children if p.pid not in set(nodes.values())],
        "engines (sim)": sims,
    }


def timed(call):
    def run():
        tic = time.perf_counter()
        call()
        return time.perf_counter() - tic

    return run


def measure(n: int, args, reply_bytes: int, ops: dict) -> dict:
    hosts = min(args.hosts, n)
    with farm_cluster("ours", n, 1, 2, hosts=hosts, reply_bytes=reply_bytes) as (rc, farm, controller):
        rc.broadcast_path = "tree"
        views = {mode: rc.broadcast_view(coalescing=mode) for mode in (True, False)}
        runs = {name: op(views) for name, op in ops.items()}
        for run in runs.values():  # warm up
            run(), run()
        meter = Meter(groups(rc, controller, farm))
        meter.idle(args.idle)
        return {name: meter.per_call(run, args.calls) for name, run in runs.items()}


OPS_SMALL = {
    "echo 1 kB, coalesced": lambda v: lambda: t_echo(v[True]),
    "echo 1 kB, streamed": lambda v: lambda: t_echo(v[False]),
    "push 1 MiB": lambda v: timed(lambda: v[True].push(dict(x=PUSH), block=True)),
}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, nargs="+", default=[16, 256, 1024, 4096])
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--idle", type=float, default=IDLE_WINDOW_S, help="seconds of idle measured first")
    parser.add_argument("--gather-bytes", type=int, default=16 * 1024)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    gather = {f"gather {args.gather_bytes // 1024} kB each": lambda v: lambda: t_echo(v[True])}
    table = [
        "| engines | call | round trip | " + " | ".join(COLS) + " | all but engines | per engine (µs) |",
        "|---:|---|" + "---:|" * (len(COLS) + 3),
    ]
    for n in args.engines:
        rows = measure(n, args, 1024, OPS_SMALL)
        rows.update(measure(n, args, args.gather_bytes, gather))
        for name, r in rows.items():
            ours = sum(r[c] for c in COLS[:-1])
            table.append(
                f"| {n} | {name} | {r['round trip']:.1f} | "
                + " | ".join(f"{r[c]:.2f}" for c in COLS)
                + f" | {ours:.1f} | {1e3 * ours / n:.1f} |"
            )
        print("\n".join(table), flush=True)
    lines = [
        __doc__.split("\n\n")[2].strip().replace("\n", " "),
        "",
        f"ms per call (CPU net of idle; round trip: median of {args.calls} calls).",
        "",
        *table,
        "",
    ]
    report("budget.py", argv, "A call's CPU by process role, 16 to 4,096 engines", lines, args.out)


if __name__ == "__main__":
    main()
