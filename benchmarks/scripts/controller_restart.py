"""The controller's main process SIGKILLed, and started again by its keeper
(``launch.keeper``, ``--restore``): how soon the cluster serves again, and
what it kept (issue 59).

    python benchmarks/scripts/controller_restart.py --reps 3 --out FILE.md

Three settings, each killed ``--reps`` times in a row, and a kill loop:

- **one host**: ``ipb.Cluster`` of ``--engines`` engines;
- **bed**: ``--bed-hosts`` network-namespace hosts of ``--bed-engines``
  engines each, behind their host relays (needs root);
- **farm**: ``--sim`` simulated engines on ``--sim-hosts`` simulated hosts,
  each behind its host relay;
- **loop**: one host, a client calling a broadcast in a loop while the
  controller is killed ``--loop-kills`` times ``--loop-every`` s apart
  (issue 73): calls right, failed, hung, and run twice.

Per kill: when the keeper's new controller process was there ("restarted");
when a broadcast to every engine was first answered by all of them ("a new
call works", each try given ``TRY`` s); whether the same engines (ids and
processes) answered, with their namespaces (a value pushed before); and how
the calls pending across the kill ended (a result, an error naming the
controller, or not within ``--wait`` s: hung). Times count from the kill.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import report  # noqa: E402

TRY = 5.0  # seconds each try of a new call is given


def hold(path):
    import os
    import time

    while not os.path.exists(path):
        time.sleep(0.02)
    return os.getpid()


def whoami():
    import os

    return os.getpid()


def kill_and_watch(rc, keeper_pid: int, gate_dir: str, wait: float, pending=True, pids=None) -> dict:
    """One kill of the controller under keeper ``keeper_pid``; what followed."""
    from ipyparallel import error

    from ipyparallel_broadcast.launch.keepsettings import main_process

    ids, view = list(rc.ids), rc.broadcast_view()
    gate = os.path.join(gate_dir, f"gate-{time.monotonic_ns()}")
    held = [view.apply_async(hold, gate), rc[:].apply_async(hold, gate)] if pending else []
    deadline = time.monotonic() + 30
    while held and time.monotonic() < deadline:  # the direct call on the engines (through the mux) before the kill
        status = rc.queue_status()
        if all(status[e]["queue"] for e in ids):
            break
        time.sleep(0.05)
    hub = main_process(keeper_pid).pid
    os.kill(hub, signal.SIGKILL)
    tic = time.monotonic()
    restarted = None
    while time.monotonic() - tic < wait:
        now = main_process(keeper_pid)
        if now is not None and now.pid != hub:
            restarted = time.monotonic() - tic
            break
        time.sleep(0.01)
    open(gate, "w").close()
    works = None
    answered = None
    while restarted is not None and time.monotonic() - tic < wait:
        try:
            answered = view.apply_async(whoami).get(timeout=TRY)
            works = time.monotonic() - tic
            break
        except (error.CompositeError, error.RemoteError, TimeoutError):
            continue
    ended = {}  # per call held across the kill: its engines' parts
    for kind, ar in zip(("broadcast", "DirectView"), held):
        ends = ended[kind] = {"result": 0, "named error": 0, "other error": 0, "hung": 0}
        if not ar.wait(max(0.0, wait - (time.monotonic() - tic))):
            ends["hung"] += len(ids)
            continue
        for r in ar.get(return_exceptions=True):
            if not isinstance(r, Exception):
                ends["result"] += 1
            elif "controller" in str(r) or "Relay node root" in str(r):
                ends["named error"] += 1
            else:
                ends["other error"] += 1
    kept = answered is not None and rc.ids == ids and (pids is None or answered == pids)
    intact = None  # (simulated engines keep no namespace)
    if pending:
        try:
            intact = works is not None and view.pull("kept", block=True) == ["yes"] * len(ids)
        except Exception:
            intact = False
    return dict(restarted=restarted, works=works, kept=kept, intact=intact, ended=ended, engines=len(ids))


def one_host(engines: int, reps: int, wait: float, gate_dir: str) -> list[dict]:
    import ipyparallel_broadcast as ipb

    with tempfile.TemporaryDirectory(prefix="ipb-restart-") as profile:
        cluster = ipb.Cluster(n=engines, profile_dir=profile, log_level=40)
        rc = cluster.start_and_connect_sync()
        try:
            rc.wait_for_engines(engines, timeout=120)
            rc.broadcast_view().push(dict(kept="yes"), block=True)
            pids = rc.broadcast_view().apply_sync(whoami)
            keeper = cluster.controller.process.pid
            return [kill_and_watch(rc, keeper, gate_dir, wait, pids=pids) for _ in range(reps)]
        finally:
            rc.close()
            cluster.stop_cluster_sync()


def tally(folder, n):
    """Engine side: note call ``n`` ran here (a line in ``folder/<pid>``); give ``n`` back."""
    import os

    with open(os.path.join(folder, str(os.getpid())), "a") as f:
        f.write(f"{n}\n")
    return n


def kill_loop(engines: int, kills: int, every: float, wait: float, gate_dir: str) -> dict:
    """A client calling a broadcast in a loop while the controller is SIGKILLed
    ``kills`` times, ``every`` seconds apart: each call right, failed (an
    error), or hung (no outcome in ``wait`` s); and the calls that ran twice on
    an engine (each engine notes each call it ran)."""
    import collections
    import threading

    from ipyparallel import error

    import ipyparallel_broadcast as ipb
    from ipyparallel_broadcast.launch.keepsettings import main_process

    folder = tempfile.mkdtemp(dir=gate_dir)
    counts, stop = collections.Counter(), threading.Event()
    with tempfile.TemporaryDirectory(prefix="ipb-restart-") as profile:
        cluster = ipb.Cluster(n=engines, profile_dir=profile, log_level=40)
        rc = cluster.start_and_connect_sync()
        try:
            rc.wait_for_engines(engines, timeout=120)
            view, keeper = rc.broadcast_view(), cluster.controller.process.pid

            def caller():
                n = 0
                while not stop.is_set():
                    n += 1
                    try:
                        got = view.apply_async(tally, folder, n).get(timeout=wait)
                        counts["right" if got == [n] * engines else "wrong"] += 1
                    except TimeoutError:
                        counts["hung"] += 1
                    except (error.CompositeError, error.RemoteError):
                        counts["failed"] += 1

            thread = threading.Thread(target=caller, daemon=True)
            thread.start()
            for _ in range(kills):
                time.sleep(every)  # (a pace, not a wait for an event)
                hub = None
                while hub is None:
                    hub = main_process(keeper)
                os.kill(hub.pid, signal.SIGKILL)
            time.sleep(every)
            stop.set()
            thread.join(wait + 10)
        finally:
            rc.close()
            cluster.stop_cluster_sync()
    twice = 0
    for name in os.listdir(folder):
        with open(os.path.join(folder, name)) as f:
            twice += sum(1 for k in collections.Counter(f.read().split()).values() if k > 1)
    return dict(counts, calls=sum(counts.values()), twice=twice)


def bed(hosts: int, per_host: int, reps: int, wait: float, gate_dir: str) -> list[dict]:
    from ipyparallel_broadcast.tools.bedcluster import BedCluster
    from ipyparallel_broadcast.tools.netbed import NetBed

    with NetBed(hosts=hosts) as netbed, BedCluster(netbed, depth=1, fanout=2, kept=reps + 1) as cluster:
        for host in netbed.hosts:
            cluster.start_engines(host, per_host)
        rc = cluster.client(wait_for=hosts * per_host)
        rc.broadcast_view().push(dict(kept="yes"), block=True)
        pids = rc.broadcast_view().apply_sync(whoami)
        return [kill_and_watch(rc, cluster.controller.pid, gate_dir, wait, pids=pids) for _ in range(reps)]


def farm(n: int, hosts: int, reps: int, wait: float, gate_dir: str) -> list[dict]:
    from ipyparallel_broadcast.tools.farm import farm_cluster

    with farm_cluster("ours", n, 1, 2, hosts=hosts) as (rc, _, hub):
        keeper = hub.parent().pid
        # simulated engines run nothing: held calls, pids and namespaces do not apply; each answers, with its id
        return [kill_and_watch(rc, keeper, gate_dir, wait, pending=False) for _ in range(reps)]


def fmt(t) -> str:
    return "never" if t is None else f"{t:.2f}"


def _yes(flag) -> str:
    return "—" if flag is None else "yes" if flag else "NO"


def rows(name: str, runs: list[dict]) -> list[str]:
    out = []
    for i, r in enumerate(runs, 1):
        pending = [
            f"{e['result']} / {e['named error']} / {e['other error']} / {e['hung']}" if e else "—"
            for e in (r["ended"].get("broadcast"), r["ended"].get("DirectView"))
        ]
        out.append(
            f"| {name} | {i} | {r['engines']} | {fmt(r['restarted'])} | {fmt(r['works'])} | "
            f"{'yes' if r['kept'] else 'NO'} | {_yes(r['intact'])} | {pending[0]} | {pending[1]} |"
        )
    works = [r["works"] for r in runs if r["works"] is not None]
    if works:
        out.append(f"| {name} | median | | | {statistics.median(works):.2f} | | | | |")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--bed-hosts", type=int, default=2)
    ap.add_argument("--bed-engines", type=int, default=4)
    ap.add_argument("--sim", type=int, default=1024)
    ap.add_argument("--sim-hosts", type=int, default=16)
    ap.add_argument("--wait", type=float, default=60.0)
    ap.add_argument("--skip", default="", help="settings to skip: one-host,bed,farm,loop")
    ap.add_argument("--loop-kills", type=int, default=5)
    ap.add_argument("--loop-every", type=float, default=8.0)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    lines = [
        "The controller's main process SIGKILLed, `--reps` times in a row per setting; its keeper starts it "
        "again with `--restore`. Times in seconds from the kill. Pending: the engines' parts of two calls held "
        "across the kill, a broadcast and a DirectView apply, each: result / error naming the controller / "
        "other error / hung.",
        "",
        "| setting | kill | engines | restarted | a new call works | same engines | namespaces "
        "| pending broadcast | pending DirectView |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory(prefix="ipb-restart-gates-") as gates:
        if "one-host" not in skip:
            lines += rows(f"one host, {args.engines} engines", one_host(args.engines, args.reps, args.wait, gates))
        if "bed" not in skip:
            name = f"bed, {args.bed_hosts} hosts x {args.bed_engines}"
            lines += rows(name, bed(args.bed_hosts, args.bed_engines, args.reps, args.wait, gates))
        if "farm" not in skip:
            name = f"farm, {args.sim} simulated on {args.sim_hosts} hosts"
            lines += rows(name, farm(args.sim, args.sim_hosts, args.reps, args.wait, gates))
        if "loop" not in skip:
            every = args.loop_every
            loop = kill_loop(args.engines, args.loop_kills, every, args.wait, gates)
            lines += [
                "",
                f"Kill loop: one host, {args.engines} engines, a client calling a broadcast in a loop while the "
                f"controller is SIGKILLed {args.loop_kills} times, {every:g} s apart (calls ran twice: counted by "
                "each engine).",
                "",
                "| calls | right | failed | hung | wrong | ran twice |",
                "|---|---|---|---|---|---|",
                f"| {loop['calls']} | {loop.get('right', 0)} | {loop.get('failed', 0)} | {loop.get('hung', 0)} "
                f"| {loop.get('wrong', 0)} | {loop['twice']} |",
            ]
    report("controller_restart.py", argv, "The controller killed and restarted", lines, args.out)


if __name__ == "__main__":
    main()
