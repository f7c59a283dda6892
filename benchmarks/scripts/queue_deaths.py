"""Each of the controller's queue processes killed in turn, on our controller and
on IPython Parallel's own: what becomes of a call pending on it, and how soon
a new call of that kind works.

    python benchmarks/scripts/queue_deaths.py --engines 4 --out FILE.md

A child process of the controller is found by the port it listens on (the
mux, task, control and IOPub ports of the client connection file, the heart
monitor's ping port of the engine's), and SIGKILLed:

- mux: a DirectView ``apply`` held on the engines; then new ``apply`` calls;
- task: a LoadBalancedView ``apply`` held on an engine; then new ones;
- control: new ``rc.clear()`` calls;
- IOPub: new ``execute`` calls whose printed line must arrive;
- heart monitor: an engine paused (SIGSTOP), which must be unregistered.

"Never" means not within ``--wait`` seconds. Each new call gets 5 s, and is
tried again until one works or the wait is over; its time counts from the
kill (control, IOPub, heart monitor) or from the pending call's end.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import sys
import tempfile
import time

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import report  # noqa: E402

from ipyparallel_broadcast.launch.keepsettings import main_process  # noqa: E402

TRY = 5.0  # seconds a new call is given


def hold(path):
    import os
    import time

    while not os.path.exists(path):
        time.sleep(0.02)
    return os.getpid()


def listener(controller: int, port: int) -> int:
    """The controller's child process listening on ``port``."""
    for child in psutil.Process(controller).children():
        if any(c.laddr.port == port and c.status == psutil.CONN_LISTEN for c in child.net_connections("tcp")):
            return child.pid
    raise LookupError(f"no child of {controller} listens on {port}")


def ended_within(ar, seconds: float):
    """Seconds until ``ar`` ended (any outcome), or None."""
    tic = time.monotonic()
    return time.monotonic() - tic if ar.wait(seconds) else None


def works_within(attempt, seconds: float):
    """Seconds until ``attempt()`` returns True, or None."""
    tic = time.monotonic()
    while time.monotonic() - tic < seconds:
        try:
            if attempt():
                return time.monotonic() - tic
        except Exception:
            pass
    return None


def fmt(t, what="") -> str:
    return "never" if t is None else f"{t:.2f} s{what}"


def outcome(ar) -> str:
    try:
        ar.get(0)
        return "ok"
    except Exception as e:
        elist = getattr(e, "elist", None)
        text = str(elist[0][1] if elist else getattr(e, "evalue", e))
        return f"`{text[:90]}`"


def one_cluster(kind: str, engines: int, wait: float, gate_dir: str) -> dict:
    import ipyparallel as ipp

    import ipyparallel_broadcast as ipb

    profile = os.path.join(gate_dir, f"profile-{kind}")
    cluster = (ipb.Cluster if kind == "ours" else ipp.Cluster)(n=engines, profile_dir=profile, log_level=40)
    rc = cluster.start_and_connect_sync()
    rc.wait_for_engines(engines, timeout=120)
    rows = {}
    try:
        ctl = main_process(cluster.controller.process.pid).pid  # (ours: the child of its keeper)
        pids = dict(zip(rc.ids, rc[:].apply_sync(os.getpid)))  # (before any queue dies)
        security = os.path.join(profile, "security")
        (client_file,) = glob.glob(os.path.join(security, "ipcontroller-*client.json"))
        (engine_file,) = glob.glob(os.path.join(security, "ipcontroller-*engine.json"))
        with open(client_file) as f:
            client_info = json.load(f)
        with open(engine_file) as f:
            engine_info = json.load(f)
        for queue in ("mux", "task"):
            gate = os.path.join(gate_dir, f"{kind}-{queue}")
            view = rc[:] if queue == "mux" else rc.load_balanced_view()
            ar = view.apply_async(hold, gate)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # on the engines (through the queue) before the kill
                status = rc.queue_status()
                if any(status[e]["queue"] + status[e]["tasks"] for e in rc.ids):
                    break
                time.sleep(0.05)
            os.kill(listener(ctl, client_info[queue]), signal.SIGKILL)
            pending = ended_within(ar, wait)
            how = outcome(ar) if pending is not None else ""
            open(gate, "w").close()
            if queue == "mux":
                again = works_within(lambda: len(rc[:].apply_async(os.getpid).get(TRY)) == engines, wait)
            else:
                again = works_within(lambda: rc.load_balanced_view().apply_async(os.getpid).get(TRY) > 0, wait)
            rows[queue] = (fmt(pending) + (f": {how}" if how else ""), fmt(again))
            rc.wait(timeout=wait)

        def cleared():
            return all(m["content"]["status"] == "ok" for m in rc.clear(block=False).result(TRY))

        os.kill(listener(ctl, client_info["control"]), signal.SIGKILL)
        rows["control"] = ("—", fmt(works_within(cleared, wait)))

        def printed():
            ar = rc[:].execute("print('back')", block=False)
            ar.get(TRY)
            ar.wait_for_output(TRY)
            return ar.stdout == ["back\n"] * engines

        os.kill(listener(ctl, client_info["iopub"]), signal.SIGKILL)
        rows["iopub"] = ("—", fmt(works_within(printed, wait)))
        os.kill(listener(ctl, engine_info["hb_ping"]), signal.SIGKILL)
        victim = pids[rc.ids[-1]]
        os.kill(victim, signal.SIGSTOP)
        try:
            found = works_within(lambda: len(rc.ids) < engines or time.sleep(0.1), wait)
        finally:
            os.kill(victim, signal.SIGCONT)
        rows["heart monitor"] = ("—", fmt(found, " (a paused engine unregistered)"))
    finally:
        rc.close()
        cluster.stop_cluster_sync()
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--wait", type=float, default=30.0, help="seconds after which a call 'never' ended")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ipb-qd-gates-") as gates:
        results = {kind: one_cluster(kind, args.engines, args.wait, gates) for kind in ("stock", "ours")}
    lines = [
        f"{args.engines} engines on this host; a queue process SIGKILLed with a call pending on it "
        f'(mux, task) or before new calls (control, IOPub, heart monitor). "never": not within {args.wait:g} s.',
        "",
        "| process killed | the pending call ended (stock) | a new call works (stock) "
        "| the pending call ended (ours) | a new call works (ours) |",
        "|---|---|---|---|---|",
    ]
    for queue in ("mux", "task", "control", "iopub", "heart monitor"):
        (sp, sn), (op, on) = results["stock"][queue], results["ours"][queue]
        lines.append(f"| {queue} | {sp} | {sn} | {op} | {on} |")
    report("queue_deaths.py", argv, "A controller queue process killed: stock and ours", lines, args.out)


if __name__ == "__main__":
    main()
