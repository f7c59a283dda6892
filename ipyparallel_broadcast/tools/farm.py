"""The tree at scale, on simulated engines: ours against DirectView and
ipyparallel's BroadcastView, driven by the same kind of farm.

    python -m ipyparallel_broadcast.tools.farm --engines 256 1024 4096

For each engine count N, one controller at a time runs with N simulated
engines (``sim.SimEngines``): a stock ipyparallel controller at each depth
(its BroadcastView, fan-out 2; DirectView once, at depth 1) and ours at each
(depth, fan-out) of ``--trees``. Every view is timed in interleaved rounds:
the round trip of one 1 kB apply (coalesced or streamed, by view) and the
throughput of ``--many`` async applies in flight. For our tree it also
reports where the time goes per call: client CPU, the busy time of the root,
interior nodes and leaves, and the CPU of the hub and of the farm itself.
"""

from __future__ import annotations

import argparse
import functools
import glob
import json
import os
import tempfile
import time
from contextlib import contextmanager

import ipyparallel as ipp
import psutil

from ..client.view import Batch
from ..compat import ipp as seam
from ..launch.keepsettings import main_process
from ..launch.launcher import Cluster
from . import bench
from .sim import SimEngines

# a farm's heartbeats share 2 cores with thousands of replies: ipyparallel's
# lenient defaults, for both controllers, so no simulated engine is dropped
HEART_PERIOD_MS = 3000
HEARTBEATS = [f"--HeartMonitor.period={HEART_PERIOD_MS}", "--HeartMonitor.max_heartmonitor_misses=10"]
# an idle rate is read over whole heartbeat periods: each is a burst of CPU at the
# hub and the relays, and a 5 s window saw one or two (a hub's idle rate off by half)
IDLE_WINDOW_S = 5 * HEART_PERIOD_MS / 1000
REPLY_BYTES = 1024
CALL_TIMEOUT = 600  # seconds


@contextmanager
def farm_cluster(
    kind: str,
    n: int,
    depth: int,
    fanout: int = 2,
    per_process: int = 512,
    hosts: int = 0,
    reply_bytes=REPLY_BYTES,
    controller_args=(),
    hosts_per_process: int = 1,
    mux: bool = True,
    in_relay: bool = False,
):
    """A controller (``ours`` or ``stock``) with ``n`` simulated engines; yields
    (client, farm, controller process). ``hosts``: the engines run as that
    many simulated hosts of ``n / hosts`` engines, each (with ours) behind its
    own host relay; a stock controller gets the same processes, relay-less.
    ``reply_bytes``: the size of every engine's apply result; ``controller_args``:
    more command-line options for the controller; ``hosts_per_process``, ``mux``,
    ``in_relay``: as ``SimEngines`` takes them (with ours; ``in_relay``: no mux)."""
    if hosts:
        per_process = -(-n // hosts) * (hosts_per_process if kind == "ours" else 1)
    with tempfile.TemporaryDirectory(prefix=f"ipb-farm-{kind}-") as profile_dir:
        common = dict(n=0, profile_dir=profile_dir, log_level=40)
        if kind == "ours":
            cluster = Cluster(depth=depth, fanout=fanout, controller_args=HEARTBEATS + list(controller_args), **common)
        else:
            cluster = ipp.Cluster(
                controller_args=HEARTBEATS
                + [f"--IPController.broadcast_scheduler_depth={bench.stock_depth(depth)}", *controller_args],
                **common,
            )
        cluster.start_controller_sync()
        try:
            rc = cluster.connect_client_sync()
            (engine_file,) = glob.glob(os.path.join(profile_dir, "security", "*-engine.json"))
            farm = SimEngines(
                engine_file,
                n,
                per_process=per_process,
                reply_bytes=reply_bytes,
                hosts=bool(hosts) and kind == "ours",
                hosts_per_process=hosts_per_process,
                mux=mux and not (in_relay and kind == "ours"),
                in_relay=in_relay and kind == "ours",
            )
            try:
                farm.start(timeout=max(120, n / 10))
                rc.wait_for_engines(n, timeout=max(120, n / 10))
                yield rc, farm, main_process(cluster.controller.process.pid)
            finally:
                rc.close()
                farm.stop()
        finally:
            cluster.stop_cluster_sync()


def farm_processes(farm: SimEngines) -> list[psutil.Process]:
    """The farm's processes, host relays included (started by the simulated hosts)."""
    procs = []
    for p, _, _ in farm.processes:
        proc = psutil.Process(p.pid)
        procs += [proc] + proc.children(recursive=True)
    return procs


def breakdown(rc, farm: SimEngines, hub: psutil.Process, calls: int = 5) -> dict[str, float]:
    """Where the time of one coalesced 1 kB apply goes (ms per call): the
    client's CPU, the relay nodes' busy time by role, the hub's CPU, the
    center's (client + every controller process) and the farm's (simulated
    engines and their host relays)."""
    view = rc.broadcast_view(coalescing=True)
    depth = rc.tree_shape.depth
    farm_procs = farm_processes(farm)
    controller = [hub] + hub.children(recursive=True)

    def snapshot():
        nodes = rc.broadcast_stats()
        role = {}
        for node in nodes:
            level = len(str(node["node"]).split(".")) if node["node"] != "root" else 0
            name = "root" if level == 0 else "leaves" if level == depth else "interior"
            if depth == 0:
                name = "root"
            role[name] = role.get(name, 0.0) + node["busy"]
        return (
            role,
            time.process_time(),
            bench.cpu_seconds([hub]),
            bench.cpu_seconds(farm_procs),
            bench.cpu_seconds(controller),
        )

    before = snapshot()
    tic = time.perf_counter()
    for _ in range(calls):
        t_echo(view)
    wall = time.perf_counter() - tic
    after = snapshot()
    out = {"wall": wall, "client cpu": after[1] - before[1]}
    for name in ("root", "interior", "leaves"):
        if name in after[0]:
            out[f"{name} busy"] = after[0][name] - before[0].get(name, 0.0)
    out["hub cpu"] = after[2] - before[2]
    out["center cpu"] = out["client cpu"] + after[4] - before[4]
    out["farm cpu"] = after[3] - before[3]
    return {k: 1e3 * v / calls for k, v in out.items()}


def t_echo(view) -> float:
    """One 1 kB apply on every engine; a call that does not finish in
    ``CALL_TIMEOUT`` raises (the run reports it) instead of hanging the run."""
    tic = time.perf_counter()
    ar = view.apply_async(bench.echo, bench.ECHO)
    if not ar.wait(CALL_TIMEOUT):
        children = seam.ar_engine_futures(ar)
        missing = sum(1 for f in children if not f.done())
        raise TimeoutError(f"{missing} of {len(children)} replies missing after {CALL_TIMEOUT} s")
    ar.get()
    return time.perf_counter() - tic


def measure(vs: dict[str, object], reps: int, many: int) -> dict[str, dict[str, float]]:
    """Median over ``reps`` interleaved rounds: echo ms and many-msgs calls/s."""
    fns = {"echo": t_echo, "many": functools.partial(bench.t_many, count=many)}
    for view in vs.values():
        t_echo(view)  # warm up
    return bench.interleaved(vs, fns, reps)


Row = tuple[int, str, str, float, float]  # engines, tree, view, echo seconds, many calls/s


@contextmanager
def _reported(what: str, out):
    """Run one cluster's part; a failure is reported and the run goes on."""
    tic = time.perf_counter()
    try:
        yield
    except Exception as e:  # a view that fails at this scale is a result too
        out(f"  {what}: FAILED ({type(e).__name__}: {e})")
    else:
        out(f"  {what}: done in {time.perf_counter() - tic:.0f} s")


def run_engines(
    n: int, trees: list[tuple[int, int]], stock_depths: list[int], reps: int, many: int, out=print, hosts: int = 0
) -> tuple[list[Row], list[dict]]:
    rows: list[Row] = []
    hops: list[dict] = []
    for depth in stock_depths:
        with (
            _reported(f"N={n} stock depth {depth}", out),
            farm_cluster("stock", n, depth, hosts=hosts) as (rc, farm, hub),
        ):
            vs = {
                "ipp BroadcastView coalescing": rc.broadcast_view(is_coalescing=True),
                "ipp BroadcastView non-coalescing": rc.broadcast_view(is_coalescing=False),
            }
            if depth == stock_depths[0]:
                vs = {"DirectView": rc[:], **vs}
            got = measure(vs, reps, many)
            rows += [(n, "-" if v == "DirectView" else f"d{depth} f2", v, got["echo"][v], got["many"][v]) for v in vs]
    for depth, fanout in trees:
        with (
            _reported(f"N={n} ours depth {depth} fan-out {fanout}", out),
            farm_cluster("ours", n, depth, fanout, hosts=hosts) as (rc, farm, hub),
        ):
            vs = {
                "ours coalescing": rc.broadcast_view(coalescing=True),
                "ours streaming": rc.broadcast_view(coalescing=False),
                "ours Batch(64)": rc.broadcast_view(coalescing=Batch(64)),
            }
            got = measure(vs, reps, many)
            rows += [(n, f"d{depth} f{fanout}", v, got["echo"][v], got["many"][v]) for v in vs]
            hops.append(dict(engines=n, tree=f"d{depth} f{fanout}", **breakdown(rc, farm, hub)))
    return rows, hops


def table(rows: list[Row], many: int) -> str:
    dv = {n: (echo, rate) for n, _, v, echo, rate in rows if v == "DirectView"}
    lines = [
        f"| engines | tree | view | 1 kB round trip (ms) | × DirectView "
        f"| {many} async calls (calls/s) | × DirectView |",
        "|---:|---|---|---:|---:|---:|---:|",
    ]
    for n, tree, view, echo, rate in rows:
        d_echo, d_rate = dv.get(n, (float("nan"), float("nan")))
        lines.append(
            f"| {n} | {tree} | {view} | {1e3 * echo:.1f} | {echo / d_echo:.2f} | {rate:.2f} | {rate / d_rate:.2f} |"
        )
    return "\n".join(lines)


def hop_table(hops: list[dict]) -> str:
    cols = ["wall", "client cpu", "root busy", "interior busy", "leaves busy", "hub cpu", "center cpu", "farm cpu"]
    lines = ["| engines | tree | " + " | ".join(f"{c} (ms)" for c in cols) + " |", "|---:|---|" + "---:|" * len(cols)]
    for h in hops:
        cells = [f"{h[c]:.1f}" if c in h else "-" for c in cols]
        lines.append(f"| {h['engines']} | {h['tree']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _tree(text: str) -> tuple[int, int]:
    depth, fanout = text.split("x")
    return int(depth), int(fanout)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument(
        "--trees",
        type=_tree,
        nargs="+",
        default=[(1, 2), (2, 2), (2, 4), (3, 2)],
        help="our trees, as DEPTHxFANOUT (default: 1x2 2x2 2x4 3x2)",
    )
    parser.add_argument(
        "--stock-depths",
        type=int,
        nargs="*",
        default=[1, 2, 3],
        help="ipyparallel's broadcast scheduler depths (none: ours only)",
    )
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--many", type=int, default=5, help="async calls in flight for the throughput column")
    parser.add_argument(
        "--hosts",
        type=int,
        default=0,
        help="run the engines as this many simulated hosts, each behind its own host relay",
    )
    parser.add_argument("--json", help="also write the rows and the time breakdown to this JSON file")
    args = parser.parse_args(argv)
    print(__doc__.split("\n\n")[1], flush=True)
    rows, hops = [], []
    for n in args.engines:  # tables (and the JSON) after each engine count: a long run shows as it goes
        r, h = run_engines(
            n,
            args.trees,
            args.stock_depths,
            args.reps,
            args.many,
            out=functools.partial(print, flush=True),
            hosts=args.hosts,
        )
        rows += r
        hops += h
        report(rows, hops, args)


def report(rows: list[Row], hops: list[dict], args):
    print(f"\nmedian of {args.reps} interleaved rounds; 1 kB apply, {REPLY_BYTES} B replies\n")
    print(table(rows, args.many))
    print(
        "\nwhere the time goes, per coalesced 1 kB apply on our tree (ms per call; busy = time a "
        "relay node spent handling messages, summed over the nodes of that role; center = the "
        "client and every controller process; farm = simulated engines and their host relays)\n"
    )
    print(hop_table(hops), flush=True)
    if args.json:
        keys = ("engines", "tree", "view", "round_trip_s", "many_calls_per_s")
        with open(args.json, "w") as f:
            json.dump(
                dict(
                    reps=args.reps,
                    many=args.many,
                    reply_bytes=REPLY_BYTES,
                    rows=[dict(zip(keys, row)) for row in rows],
                    breakdown_ms=hops,
                ),
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
