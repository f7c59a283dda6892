"""What registering N engines costs the center, ours beside a stock IPython
Parallel controller: a farm of simulated engines (``SimEngines``; for ours,
``hosts=True``: each process a host with its own host relay; for stock, the
same processes, relay-less) registers with one controller, and a client
connected before any engine waits for all of them. Meanwhile another thread
makes clients one after another, each timed as it connects and as the hub
answers one query (``queue_status``). Per engine count: seconds until the
client saw every engine, the controller's CPU meanwhile (its main process,
the hub, and every process it started: relay nodes, queues, the heart
monitor), the same per engine, the controller's idle CPU once all are in (its
heartbeats), its memory (summed RSS, which counts the pages forked processes
share once per process, and PSS, which splits them: what the processes
really hold), the probing clients' worst connection and query, and the round
trip of a 1 kB echo on every engine (ours: a coalesced BroadcastView; stock:
a DirectView).

    python benchmarks/scripts/registration.py --engines 1024 4096 --hosts 16 64 --kinds ours stock --out FILE
"""

from __future__ import annotations

import argparse
import glob
import multiprocessing
import os
import statistics
import sys
import tempfile
import time

import ipyparallel as ipp
import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import report  # noqa: E402

import ipyparallel_broadcast as ipb  # noqa: E402
from ipyparallel_broadcast.tools.bench import cpu_seconds as cpu  # noqa: E402
from ipyparallel_broadcast.tools.farm import HEART_PERIOD_MS, t_echo  # noqa: E402
from ipyparallel_broadcast.tools.sim import SimEngines  # noqa: E402

ECHOES = 5  # timed echoes after one warm-up: their median


def center(pid: int) -> list[psutil.Process]:
    main = psutil.Process(pid)
    return [main, *main.children(recursive=True)]


def farm_processes(farm: SimEngines) -> list[psutil.Process]:
    """The farm's processes and what they started (their host relays)."""
    procs = []
    for proc, _, _ in farm.processes:
        try:
            p = psutil.Process(proc.pid)
            procs += [p, *p.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
    return procs


def memory(procs: list[psutil.Process]) -> tuple[int, int]:
    """(summed RSS, summed PSS) of the processes still running, in bytes."""
    rss = pss = 0
    for p in procs:
        try:
            m = p.memory_full_info()
        except psutil.NoSuchProcess:
            continue
        rss, pss = rss + m.rss, pss + m.pss
    return rss, pss


def hub_process(procs: list[psutil.Process]) -> psutil.Process:
    """The hub: the first controller process (ours runs under its keeper, which is the first of all)."""
    for p in procs:
        try:
            cmd = " ".join(p.cmdline())
        except psutil.NoSuchProcess:
            continue
        if ".controller" in cmd and "keeper" not in cmd:
            return p
    return procs[0]


def process_name(p: psutil.Process) -> str:
    """Ours name their processes (ipb-node-0, ipb-heart, ...); stock's are all python."""
    try:
        return p.name()
    except psutil.NoSuchProcess:
        return "gone"


def code_commit(tree: str) -> str:
    import subprocess

    return subprocess.run(["git", "-C", tree, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


def probe(connection_file: str, kind: str, ready, done, out, pause: float = 0.2):
    """In a process of its own (a user's, beside the farm): clients made one
    after another until ``done``; each one's seconds to connect, and for the hub
    to answer its ``queue_status``; failures by name. All sent to ``out``."""
    make_client = ipb.Client if kind == "ours" else ipp.Client
    connects, queries, failures = [], [], []
    ready.set()  # (imports done: a spawned process's start is slow on a loaded machine)
    while not done.is_set():
        tic = time.monotonic()
        try:
            client = make_client(connection_file)
        except Exception as e:  # what a user would have met: counted, named
            failures.append(f"connect: {e!r}")
            continue
        try:
            connected = time.monotonic()
            client.queue_status()
            connects.append(connected - tic)
            queries.append(time.monotonic() - connected)
        except Exception as e:
            failures.append(f"query: {e!r}")
        finally:
            client.close()
        done.wait(pause)
    out.send((connects, queries, failures))


class Prober:
    """``probe`` in a process of its own, started and stopped around the registrations."""

    def __init__(self, connection_file: str, kind: str, pause: float = 0.2):
        ctx = multiprocessing.get_context("spawn")  # (this process runs a client's threads: no fork)
        self.ready, self.done = ctx.Event(), ctx.Event()
        self.results, there = ctx.Pipe(duplex=False)
        args = (connection_file, kind, self.ready, self.done, there, pause)
        self.process = ctx.Process(target=probe, args=args, daemon=True)
        self.connects: list[float] = []
        self.queries: list[float] = []
        self.failures: list[str] = []

    def start(self):
        """Once the prober is ready to make clients (before the farm starts)."""
        self.process.start()
        if not self.ready.wait(120):
            raise RuntimeError("the probing process did not start in 120 s")

    def stop(self):
        self.done.set()
        if self.results.poll(120):
            self.connects, self.queries, self.failures = self.results.recv()
        self.process.join(10)


def heartbeats(period_s: float | None) -> list[str]:
    """The heart monitor's settings, both controllers: a period, 10 misses (ipyparallel's lenient defaults
    at 3 s); ``None``: each controller's own defaults (ours 0.8 s x 3, stock 3 s x 10)."""
    if period_s is None:
        return []
    return [f"--HeartMonitor.period={int(1000 * period_s)}", "--HeartMonitor.max_heartmonitor_misses=10"]


def make_cluster(kind: str, profile_dir: str, period_s: float):
    common = dict(n=0, profile_dir=profile_dir, log_level=40)
    if kind == "ours":
        return ipb.Cluster(depth=1, fanout=2, controller_args=heartbeats(period_s), **common)
    return ipp.Cluster(controller_args=heartbeats(period_s), **common)


def idle_seconds(period_s: float | None) -> float:
    """The idle window: five heartbeat periods; at the defaults 24 s (30 of ours, 8 of stock's)."""
    return 24.0 if period_s is None else 5 * period_s


def one_run(
    kind: str,
    n: int,
    hosts: int,
    timeout: float,
    nice: int = 0,
    pause: float = 0.2,
    per_process: int = 1,
    mux=True,
    period_s: float | None = HEART_PERIOD_MS / 1000,
    in_relay: bool = False,
) -> dict:
    """``per_process``: simulated hosts a farm process is (ours); ``mux``: engines connect to the hub's mux;
    ``in_relay``: each host's relay simulates its engines (``tools.simhost``);
    ``period_s``: the heart monitor's period (the idle window: five of them; ``None``: the defaults)."""
    idle_window = idle_seconds(period_s)
    with tempfile.TemporaryDirectory(prefix="ipb-registration-") as profile_dir:
        cluster = make_cluster(kind, profile_dir, period_s)
        cluster.start_controller_sync()
        client = cluster.connect_client_sync()
        security = os.path.join(profile_dir, "security")
        (engine_file,) = glob.glob(os.path.join(security, "*-engine.json"))
        (client_file,) = glob.glob(os.path.join(security, "*-client.json"))
        procs = center(cluster.controller.process.pid)
        farm = SimEngines(
            engine_file,
            n,
            per_process=-(-n // hosts) * (per_process if kind == "ours" else 1),
            hosts=kind == "ours",
            nice=nice,
            hosts_per_process=per_process,
            mux=mux,
            in_relay=in_relay and kind == "ours",
        )
        prober = Prober(client_file, kind, pause)
        try:
            prober.start()
            hub_proc = hub_process(procs)
            before, hub_before, tic = cpu(procs), cpu([hub_proc]), time.monotonic()
            each_before = {p.pid: cpu([p]) for p in procs}
            try:
                farm.start(timeout=max(120, n / 10))
                client.wait_for_engines(n, timeout=timeout)
            finally:
                prober.stop()
            seconds = time.monotonic() - tic
            farm_cpu = cpu(farm_processes(farm))  # (all of it: every farm process started in the window)
            procs = center(cluster.controller.process.pid)  # (and whatever it started meanwhile)
            registering, hub = cpu(procs) - before, cpu([hub_proc]) - hub_before
            reg_by_process: dict[str, float] = {}
            for p in procs:
                name = "hub" if p.pid == hub_proc.pid else process_name(p)
                reg_by_process[name] = reg_by_process.get(name, 0.0) + cpu([p]) - each_before.get(p.pid, 0.0)
            idle_from, each_from = cpu(procs), [cpu([p]) for p in procs]
            time.sleep(idle_window)  # the idle window: whole heartbeat periods
            idle = (cpu(procs) - idle_from) / idle_window
            by_process: dict[str, float] = {}
            for p, before_p in zip(procs, each_from):
                name = "hub" if p.pid == hub_proc.pid else process_name(p)
                by_process[name] = by_process.get(name, 0.0) + (cpu([p]) - before_p) / idle_window
            rss, pss = memory(procs)
            view = client.broadcast_view(coalescing=True) if kind == "ours" else client[:]
            t_echo(view)  # warm up
            echo = statistics.median(t_echo(view) for _ in range(ECHOES))
            return dict(
                seconds=seconds,
                cpu=registering,
                hub=hub,
                farm=farm_cpu,
                idle=idle,
                by_process=by_process,
                reg_by_process=reg_by_process,
                rss=rss,
                pss=pss,
                echo=echo,
                prober=prober,
            )
        finally:
            client.close()
            farm.stop()
            cluster.stop_cluster_sync()


def row(kind: str, n: int, hosts: int, r: dict) -> str:
    p = r["prober"]
    probes = (
        f"{len(p.connects)} | {1e3 * max(p.connects, default=0):.0f} | {1e3 * max(p.queries, default=0):.0f} | "
        f"{len(p.failures)}"
    )
    where = f"{n} / {hosts}" if kind == "ours" else f"{n} ({-(-n // hosts)} per process)"
    return (
        f"| {kind} | {where} | {r['seconds']:.1f} | {r['cpu']:.1f} | {r['hub']:.1f} | {r['farm']:.1f} | "
        f"{1e3 * r['cpu'] / n:.2f} | "
        f"{100 * r['idle']:.1f} | {r['rss'] / 2**20:.0f} | {r['pss'] / 2**20:.0f} | {probes} | {1e3 * r['echo']:.0f} |"
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, nargs="+", default=[1024])
    parser.add_argument("--hosts", type=int, nargs="+", default=[16], help="simulated hosts, one per engine count")
    parser.add_argument("--kinds", nargs="+", default=["ours"], choices=["ours", "stock"])
    parser.add_argument("--stock-max", type=int, default=4096, help="the most engines a stock controller is given")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument(
        "--farm-nice",
        type=int,
        default=0,
        help="run the farm (and its host relays) at this lower priority: the controller is served first, "
        "as if the engines ran on hosts of their own",
    )
    parser.add_argument(
        "--probe-pause",
        type=float,
        default=0.2,
        help="seconds between probing clients (with --farm-nice, a longer pause leaves the farm its share)",
    )
    parser.add_argument(
        "--hosts-per-process",
        type=int,
        default=1,
        help="simulated hosts a farm process is, running their relays on one loop (1: each host a process, "
        "its relay started as a real engine starts it)",
    )
    parser.add_argument("--no-mux", action="store_true", help="simulated engines do not connect to the hub's mux")
    parser.add_argument(
        "--in-relay",
        action="store_true",
        help="with --no-mux, ours: each host's relay simulates its engines (no engine sockets or threads)",
    )
    parser.add_argument(
        "--heart-period", type=float, default=HEART_PERIOD_MS / 1000, help="the heart monitor's period, seconds"
    )
    parser.add_argument(
        "--heart-defaults",
        action="store_true",
        help="each controller's own heartbeat defaults (ours 0.8 s x 3, stock 3 s x 10), not --heart-period",
    )
    parser.add_argument("--code", help="the package of this tree instead (a git worktree: an A/B)")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    if args.code:  # the processes started below import the package from there: on their path first,
        # and their working directory (``python -m`` puts it before the path)
        args.out = args.out and os.path.abspath(args.out)
        os.environ["PYTHONPATH"] = os.path.abspath(args.code) + os.pathsep + os.environ.get("PYTHONPATH", "")
        os.chdir(args.code)
    period = None if args.heart_defaults else args.heart_period
    beats = (
        "each controller's default heartbeats: ours every 0.8 s, 3 misses; stock every 3 s, 10 misses"
        if period is None
        else f"heartbeats every {period:g} s, 10 misses, for both"
    )
    lines = [
        f"A controller (ours: depth 1, fan-out 2; {beats}), a client connected",
        "before any engine, then a farm of simulated engines: for ours, each process a host with its own host",
        "relay; for stock, the same processes without. 'all in': from the farm's start until the client saw",
        "every engine; 'center CPU': the controller's processes meanwhile (the hub, relay nodes, queues, heart",
        "monitor); 'farm CPU': the farm's processes and their host relays from their start until all were in,",
        "on the same two cores (all in >= (center CPU + farm CPU) / 2);",
        f"'idle': the center's CPU once all are in, over {idle_seconds(period):g} s, in a share of one core; 'RSS':",
        "summed over those processes (pages that forked processes share counted once each); 'PSS': each shared",
        "page split among its sharers. Probes: clients made one after another while the engines registered",
        f"({args.probe_pause:g} s apart): how many, the slowest connection, the slowest answer to a query",
        "(queue_status), and how many failed.",
        f"'echo': the median of {ECHOES} round trips of a 1 kB apply on every engine once all are in (ours: a",
        "coalesced BroadcastView; stock: a DirectView). Every process is on this machine (2 cores)"
        + (
            f"; the farm and its host relays ran at nice {args.farm_nice} (the relays' own sessions too), so the"
            " controller was served first"
            if args.farm_nice
            else ""
        )
        + ". The probing clients ran in a process of their own."
        + (
            f" Each farm process was {args.hosts_per_process} simulated hosts, running their host relays (the real"
            " relay code, each its own node and sockets) on one event loop (relay.loop)."
            if args.hosts_per_process > 1
            else ""
        )
        + (" The simulated engines did not connect to the hub's mux: the tree alone reached them." * args.no_mux)
        + (
            " Each host's relay simulated its engines itself (tools.simhost): no engine had a socket or a thread;"
            " their registrations, hearts and replies entered the relay's own code as if read from its sockets."
            * args.in_relay
        )
        + (f" The controller and the farm ran the package at commit {code_commit(args.code)}." if args.code else ""),
        "",
        "| controller | engines / hosts | all in (s) | center CPU (s) | of it the hub's (s) | farm CPU (s) "
        "| center per engine (ms) "
        "| idle (% of a core) | RSS (MiB) | PSS (MiB) | probes | slowest connect (ms) | slowest query (ms) "
        "| failed probes | echo (ms) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    idle_lines = ["", "Idle CPU by controller process (% of a core, the same window):", ""]
    reg_lines = ["", "Center CPU while registering, by controller process (s):", ""]
    for kind in args.kinds:
        for n, hosts in zip(args.engines, args.hosts, strict=True):
            if kind == "stock" and n > args.stock_max:
                continue
            try:
                r = one_run(
                    kind,
                    n,
                    hosts,
                    args.timeout,
                    args.farm_nice,
                    args.probe_pause,
                    args.hosts_per_process,
                    not args.no_mux,
                    period,
                    args.in_relay,
                )
            except Exception as e:  # a controller that cannot take this many: said in the table
                lines.append(f"| {kind} | {n} | not all in: {type(e).__name__}: {str(e)[:120]} |" + " |" * 12)
            else:
                lines.append(row(kind, n, hosts, r))
                shares = sorted(r["by_process"].items(), key=lambda kv: -kv[1])
                idle_lines.append(f"- {kind}, {n}: " + ", ".join(f"{k} {100 * v:.1f}" for k, v in shares))
                shares = sorted(r["reg_by_process"].items(), key=lambda kv: -kv[1])
                reg_lines.append(f"- {kind}, {n}: " + ", ".join(f"{k} {v:.2f}" for k, v in shares))
                failures = sorted(set(r["prober"].failures))
                if failures:
                    print(f"{kind} {n}: probe failures: {failures[:5]}", flush=True)
            print(lines[-1], flush=True)
    lines += reg_lines + idle_lines
    report("registration.py", argv, "What registering engines costs the center", lines, args.out)


if __name__ == "__main__":
    main()
