"""What a call costs at the center (client + controller host), on simulated hosts.

    python benchmarks/scripts/center.py --engines 256 1024 4096 --hosts 16 --out benchmarks/results/center-16hosts.md

For each engine count N, N simulated engines (``sim.SimEngines``) run as
``--hosts`` simulated hosts of N/hosts engines. With our controller each
host has its own host relay; a stock ipyparallel controller gets the same
engine processes, connected straight to it. Every process is on this machine,
so the round trips share its cores with the farm; the CPU columns tell the
center's share apart from the farm's (the simulated engines and host relays).

"center" = this client process + the controller and all its processes (hub,
relay nodes, ipyparallel's schedulers and heart monitor). Each CPU figure is
given net of the process's idle rate, measured over ``--idle`` seconds before
the calls (heartbeats of N engines cost the center with or without calls; by
default 15 s, whole heartbeat periods), and the idle rate itself in its own
column. Idle work can stop during calls (a farm that holds both cores answers
its heartbeats late, and the hub handles fewer): a process whose net figure
comes out below zero counts as 0 in the center's sum. The file is written with
its command and commit.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import threading
import time
from contextlib import contextmanager

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import report  # noqa: E402

from ipyparallel_broadcast.client.guard import contained  # noqa: E402
from ipyparallel_broadcast.tools import bench  # noqa: E402
from ipyparallel_broadcast.tools.farm import (  # noqa: E402
    CALL_TIMEOUT,
    IDLE_WINDOW_S,
    REPLY_BYTES,
    farm_cluster,
    farm_processes,
    t_echo,
)


@contextmanager
def cluster(
    kind: str, n: int, hosts: int, depth: int, fanout: int, controller_args=(), per_process: int = 1, in_relay=False
):
    """Yields (client, controller process, farm processes); ``per_process``: simulated hosts a farm process is;
    ``in_relay``: their relays simulate their engines (``tools.simhost``)."""
    with farm_cluster(
        kind,
        n,
        depth,
        fanout,
        hosts=hosts,
        controller_args=controller_args,
        hosts_per_process=per_process,
        in_relay=in_relay,
    ) as (rc, farm, controller):
        yield rc, controller, farm_processes(farm)


def sent_per_call(rc) -> int:
    """Requests the busiest node of the center sent for one call (a traced one: its "request out")."""
    ar = rc.broadcast_view(trace=True).apply_async(t_one)
    ar.get(timeout=CALL_TIMEOUT)
    counts = [e.get("detail") for e in ar.trace if e.get("event") == "request out" and "host" not in e["where"]]
    return max(c for c in counts if isinstance(c, int))


class Meter:
    """CPU seconds of process groups, net of their idle rates."""

    def __init__(self, groups):
        self.groups = groups  # name -> list of psutil.Process

    def read(self):
        return {name: bench.cpu_seconds(procs) for name, procs in self.groups.items()}, time.perf_counter()

    def idle(self, seconds: float) -> dict:
        before, t0 = self.read()
        time.sleep(seconds)  # a measured interval with nothing sent, not a wait for an event
        after, t1 = self.read()
        self.rates = {k: (after[k] - before[k]) / (t1 - t0) for k in after}
        return self.rates

    def per_call(self, run, calls: int) -> dict:
        """ms of CPU per call, net of idle, by group; and the round trips."""
        before, t0 = self.read()
        walls = [run() for _ in range(calls)]
        after, t1 = self.read()
        out = {k: 1e3 * ((after[k] - before[k]) - self.rates[k] * (t1 - t0)) / calls for k in after}
        out["round trip"] = 1e3 * statistics.median(walls)
        return out


def controller_groups(rc, controller: psutil.Process, ours: bool) -> dict:
    """The controller's processes by role: hub, relay nodes, the rest."""
    children = controller.children(recursive=True)
    nodes = {n["pid"] for n in rc.broadcast_stats()} if ours else set()
    return {
        "hub": [controller],
        "relay nodes": [p for p in children if p.pid in nodes],
        "other controller": [p for p in children if p.pid not in nodes],
    }


def client_profile(rc, view, calls: int, top: int = 12) -> str:
    """cProfile of the client's I/O thread handling the replies, plus the calls."""
    prof = cProfile.Profile()
    dispatch = rc._dispatch_broadcast

    def profiled(frames):
        prof.enable()
        try:
            return dispatch(frames)
        finally:
            prof.disable()

    bound = threading.Event()

    def rebind():  # on the I/O thread, which owns the stream
        rc._broadcast_stream.on_recv(contained(profiled, rc.session, "broadcast", None), copy=False)
        bound.set()

    rc._io_loop.add_callback(rebind)
    bound.wait(10)
    prof.enable()
    for _ in range(calls):
        t_echo(view)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    text = out.getvalue()
    return text[text.index("ncalls") :] if "ncalls" in text else text


def t_one():
    return 1


def t_reduce(view, n) -> float:
    """A scalar reduce(sum) of 1 per engine: its seconds (the simulated engines answer 1 each)."""
    tic = time.perf_counter()
    got = view.reduce(t_one, op="sum", block=False).get(timeout=CALL_TIMEOUT)
    if got != n:
        raise ValueError(f"a reduce of 1 per engine gave {got}, not {n}")
    return time.perf_counter() - tic


def measure_ours(n, args, lines, host_fanout=None):
    extra = [] if args.hub_records else ["--BroadcastController.hub_records=False"]
    if host_fanout is not None:
        extra.append(f"--BroadcastController.host_fanout={host_fanout}")
    with cluster("ours", n, args.hosts, args.depth, args.fanout, extra, args.hosts_per_process, args.in_relay) as (
        rc,
        controller,
        farm,
    ):
        groups = dict(client=[psutil.Process()], **controller_groups(rc, controller, True), farm=farm)
        meter = Meter(groups)
        coalesced, streamed = rc.broadcast_view(coalescing=True), rc.broadcast_view(coalescing=False)
        for _ in range(3):
            t_echo(coalesced), t_echo(streamed)
        rates = meter.idle(args.idle)
        rows = {
            "ours coalescing": meter.per_call(lambda: t_echo(coalesced), args.calls),
            "ours streaming": meter.per_call(lambda: t_echo(streamed), args.calls),
        }
        sent = sent_per_call(rc)
        for row in rows.values():
            row["sent"] = sent
        if args.reduce:  # the simulated engines answer a reduce with 1: the sum is the engine count
            t_reduce(coalesced, n)
            rows["ours reduce (scalar sum)"] = meter.per_call(lambda: t_reduce(coalesced, n), args.calls)
        if args.profile:
            lines += [
                f"client profile, N={n}, {args.calls} coalesced calls (cProfile, tottime):",
                "",
                "```",
                client_profile(rc, coalesced, args.calls).rstrip(),
                "```",
                "",
            ]
        return rows, rates


def measure_stock(n, args):
    with cluster("stock", n, args.hosts, args.depth, 2) as (rc, controller, farm):
        groups = dict(client=[psutil.Process()], **controller_groups(rc, controller, False), farm=farm)
        meter = Meter(groups)
        views = {"DirectView": rc[:], "ipp BroadcastView coalescing": rc.broadcast_view(is_coalescing=True)}
        for v in views.values():
            t_echo(v)
        rates = meter.idle(args.idle)
        return {name: meter.per_call(lambda v=v: t_echo(v), args.stock_calls) for name, v in views.items()}, rates


COLS = ["round trip", "client", "hub", "relay nodes", "other controller", "farm"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--depth", type=int, default=1)
    parser.add_argument("--fanout", type=int, default=2)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--stock-calls", type=int, default=5)
    parser.add_argument("--idle", type=float, default=IDLE_WINDOW_S, help="seconds of idle measured first")
    parser.add_argument("--no-stock", dest="stock", action="store_false")
    parser.add_argument(
        "--no-hub-records",
        dest="hub_records",
        action="store_false",
        help="our controller without the hub's per-engine records (BroadcastController.hub_records=False)",
    )
    parser.add_argument("--profile", action="store_true", help="add a cProfile of the client's reply handling")
    parser.add_argument("--reduce", action="store_true", help="add a scalar reduce(sum) to every engine")
    parser.add_argument(
        "--host-fanout",
        type=int,
        nargs="+",
        default=[None],
        help="our controller's BroadcastController.host_fanout, one run each (0: a leaf sends to every host)",
    )
    parser.add_argument(
        "--hosts-per-process", type=int, default=1, help="simulated hosts a farm process is (it runs their relays)"
    )
    parser.add_argument(
        "--in-relay",
        action="store_true",
        help="ours: each simulated host's relay simulates its engines (no engine sockets, not on the mux)",
    )
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    lines = [
        __doc__.split("\n\n")[2].strip().replace("\n", " "),
        "",
        f"1 kB apply to every engine, {REPLY_BYTES} B replies"
        + ("; reduce: a scalar sum of one number per engine" if args.reduce else "")
        + f"; depth {args.depth}, fan-out {args.fanout}"
        + ("" if args.hub_records else "; our controller without the hub's per-engine records")
        + (f"; {args.hosts_per_process} simulated hosts per farm process" if args.hosts_per_process > 1 else "")
        + ("; each host's relay simulated its engines (tools.simhost)" if args.in_relay else "")
        + "; ms per call: round trip (median), then CPU net of idle (the center's sum counts a"
        + " process below zero, its idle work stopped meanwhile, as 0). 'sent': the requests the"
        + " busiest relay node of the center sent for one call (its trace's 'request out').",
        "",
    ]
    table = [
        "| engines | view | " + " | ".join(COLS) + " | center CPU | center per engine (µs) | sent |",
        "|---:|---|" + "---:|" * (len(COLS) + 3),
    ]
    idle = ["| engines | cluster | " + " | ".join(c for c in COLS[1:]) + " |", "|---:|---|" + "---:|" * 5]
    centers = {}
    for n in args.engines:
        results = {}
        for host_fanout in args.host_fanout:
            ours, rates = measure_ours(n, args, lines, host_fanout)
            named = "" if host_fanout is None else f", host_fanout {host_fanout}"
            results.update({f"{view}{named}": r for view, r in ours.items()})
            idle.append(f"| {n} | ours{named} | " + " | ".join(f"{100 * rates[c]:.1f}%" for c in COLS[1:]) + " |")
        if args.stock:
            stock, stock_rates = measure_stock(n, args)
            results.update(stock)
            idle.append(f"| {n} | stock | " + " | ".join(f"{100 * stock_rates[c]:.1f}%" for c in COLS[1:]) + " |")
        for view, r in results.items():
            # a process's net below zero (its idle work stopped meanwhile) counts as 0
            center = sum(max(0.0, r[c]) for c in ("client", "hub", "relay nodes", "other controller"))
            centers[n, view] = center
            table.append(
                f"| {n} | {view} | "
                + " | ".join(f"{r[c]:.1f}" for c in COLS)
                + f" | {center:.1f} | {1e3 * center / n:.1f} | {r.get('sent', '')} |"
            )
        print("\n".join(table), flush=True)
    lines += table + ["", "idle CPU (share of one core):", ""] + idle + [""]
    if len(args.engines) > 1 and args.host_fanout == [None]:
        lo, hi = min(args.engines), max(args.engines)
        for view in ("ours coalescing", "ours streaming"):
            lines.append(
                f"- center CPU growth {lo} → {hi} engines, {view}: {centers[hi, view] / centers[lo, view]:.2f}×"
            )
    for n in args.engines:
        ours = centers.get((n, "ours coalescing"))
        for view in ("DirectView", "ipp BroadcastView coalescing"):
            if (n, view) in centers and ours is not None:
                lines.append(f"- N={n}: center CPU of ours coalescing = {ours / centers[n, view]:.3f}× {view}'s")
    report("center.py", argv, f"The center's cost per call: {args.hosts} simulated hosts", lines, args.out)


if __name__ == "__main__":
    main()
