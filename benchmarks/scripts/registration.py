"""What registering N engines costs the center: a farm of simulated hosts
(``SimEngines``, ``hosts=True``: each process a host with its own host relay)
registers with one controller, and a client connected before any engine
waits for all of them. Per engine count: seconds until the client saw every
engine, the controller's CPU meanwhile (its main process, the hub, and every
process it started: relay nodes, queues, the heart monitor), the same per
engine, the controller's idle CPU once all are in (its heartbeats), and its
RSS.

    python benchmarks/scripts/registration.py --engines 1024 4096 --hosts 16 64 --out FILE
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile
import time

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import report  # noqa: E402

from ipyparallel_broadcast import Cluster  # noqa: E402
from ipyparallel_broadcast.tools.bench import cpu_seconds as cpu  # noqa: E402
from ipyparallel_broadcast.tools.farm import HEARTBEATS, IDLE_WINDOW_S  # noqa: E402
from ipyparallel_broadcast.tools.sim import SimEngines  # noqa: E402


def center(pid: int) -> list[psutil.Process]:
    main = psutil.Process(pid)
    return [main, *main.children(recursive=True)]


def code_commit(tree: str) -> str:
    import subprocess

    return subprocess.run(["git", "-C", tree, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


def one_run(n: int, hosts: int, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="ipb-registration-") as profile_dir:
        cluster = Cluster(n=0, depth=1, fanout=2, profile_dir=profile_dir, log_level=40, controller_args=HEARTBEATS)
        cluster.start_controller_sync()
        client = cluster.connect_client_sync()
        (engine_file,) = glob.glob(os.path.join(profile_dir, "security", "*-engine.json"))
        procs = center(cluster.controller.pid)
        farm = SimEngines(engine_file, n, per_process=-(-n // hosts), hosts=True)
        try:
            before, hub_before, tic = cpu(procs), cpu(procs[:1]), time.monotonic()
            farm.start(timeout=max(120, n / 10))
            client.wait_for_engines(n, timeout=timeout)
            seconds = time.monotonic() - tic
            procs = center(cluster.controller.pid)  # (and whatever it started meanwhile)
            registering, hub = cpu(procs) - before, cpu(procs[:1]) - hub_before
            idle_from = cpu(procs)
            time.sleep(IDLE_WINDOW_S)  # the idle window: whole heartbeat periods
            idle = (cpu(procs) - idle_from) / IDLE_WINDOW_S
            rss = sum(p.memory_info().rss for p in procs if p.is_running())
            return dict(seconds=seconds, cpu=registering, hub=hub, idle=idle, rss=rss)
        finally:
            client.close()
            farm.stop()
            cluster.stop_cluster_sync()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, nargs="+", default=[1024])
    parser.add_argument("--hosts", type=int, nargs="+", default=[16], help="simulated hosts, one per engine count")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--code", help="the package of this tree instead (a git worktree: an A/B)")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    if args.code:  # the processes started below import the package from there: on their path first,
        # and their working directory (``python -m`` puts it before the path)
        args.out = args.out and os.path.abspath(args.out)
        os.environ["PYTHONPATH"] = os.path.abspath(args.code) + os.pathsep + os.environ.get("PYTHONPATH", "")
        os.chdir(args.code)
    lines = [
        "A controller (depth 1, fan-out 2; heartbeats every 3 s, 10 misses), a client connected before",
        "any engine, then a farm of simulated hosts, each process a host with its own host relay. 'all in':",
        "from the farm's start until the client saw every engine; 'center CPU': the controller's processes",
        "meanwhile (the hub, relay nodes, queues, heart monitor); 'idle': their CPU once all are in, over",
        f"{IDLE_WINDOW_S:g} s, in a share of one core. Every process is on this machine (2 cores)."
        + (f" The controller and the farm ran the package at commit {code_commit(args.code)}." if args.code else ""),
        "",
        "| engines / hosts | all in (s) | center CPU (s) | of it the hub's (s) | per engine (ms) | idle (% of a core) "
        "| center RSS (MiB) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for n, hosts in zip(args.engines, args.hosts, strict=True):
        r = one_run(n, hosts, args.timeout)
        lines.append(
            f"| {n} / {hosts} | {r['seconds']:.1f} | {r['cpu']:.1f} | {r['hub']:.1f} | {1e3 * r['cpu'] / n:.2f} | "
            f"{100 * r['idle']:.1f} | {r['rss'] / 2**20:.0f} |"
        )
        print(lines[-1], flush=True)
    report("registration.py", argv, "What registering engines costs the center", lines, args.out)


if __name__ == "__main__":
    main()
