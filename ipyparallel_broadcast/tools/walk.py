"""Follow one broadcast through every process: which of this package's files
each process runs, in order, for one coalesced ``apply_sync``.

    python -m ipyparallel_broadcast.tools.walk --engines 4 --depth 1

Every Python process of the cluster (controller, relay nodes, engines, the
client) starts with a profile hook (``sys.setprofile``, via a
``sitecustomize`` on ``PYTHONPATH``) that notes each call from one file of
this package into another, with the system's monotonic clock. After the call,
each process is asked (SIGUSR1) to write what it noted; the calls between the
call's start and its end are the walk. A warm-up call goes first, so the walk
is the steady path, not first-call setup.

Per process: the package files the call runs, in the order first run, and the
pairs of files that call each other (A calls into B and B into A: a
back-and-forth a reader follows in both directions). Each relay node's poll
loop turns several times within the call; its housekeeping (timers, heap
trimming) is part of what it runs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time

PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HOOK = """
import os, sys, threading, time, json, signal, collections
_dir, _pkg = os.environ["IPB_WALK_DIR"], os.environ["IPB_WALK_PACKAGE"]
_moves = collections.deque(maxlen=500_000)

def _hook(frame, event, arg):
    if event != "call":
        return
    f = frame.f_code.co_filename
    if not f.startswith(_pkg):
        return
    back = frame.f_back
    caller = back.f_code.co_filename if back is not None else ""
    if caller != f:
        caller = caller[len(_pkg) + 1:] if caller.startswith(_pkg) else None
        _moves.append((time.monotonic_ns(), f[len(_pkg) + 1:], caller))

def _dump(*_):
    import multiprocessing
    who = dict(pid=os.getpid(), argv=sys.argv, name=multiprocessing.current_process().name,
               main=threading.main_thread().ident, moves=list(_moves))
    path = os.path.join(_dir, f"{os.getpid()}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(who, f)
    os.replace(path + ".tmp", path)

sys.setprofile(_hook)
threading.setprofile(_hook)
try:
    signal.signal(signal.SIGUSR1, _dump)
except ValueError:
    pass
"""


def role(record: dict) -> str:
    """Which process this was, from its argv and multiprocessing name."""
    argv, name = " ".join(record["argv"]), record["name"]
    if name.startswith("RelayNode"):
        return f"relay node {name[len('RelayNode(') : -1]}"
    if name != "MainProcess":
        return name
    if "ipyparallel_broadcast.engine" in argv or "engine/__main__" in argv or "ipengine" in argv:
        return "engine"
    if "nanny" in argv.lower():
        return "nanny"
    if "controller" in argv:
        return "controller"
    return "client" if record.get("client") else argv[:60]


def walk(records: list, start: int, end: int) -> list:
    """Per process: the package files the call ran, in the order first run,
    and the calls between them (caller file, callee file)."""
    rows = []
    for rec in records:
        moves = sorted(m for m in rec["moves"] if start <= m[0] <= end)
        if not moves:
            continue
        files, calls = [], set()
        for _, callee, caller in moves:
            for f in (caller, callee):
                if f is not None and f not in files:
                    files.append(f)
            if caller is not None:
                calls.add((caller, callee))
        rows.append(dict(role=role(rec), pid=rec["pid"], files=files, calls=sorted(calls)))
    return sorted(rows, key=lambda r: (r["role"], r["pid"]))


def back_and_forth(calls) -> list:
    """Pairs of files that call each other."""
    calls = set(map(tuple, calls))
    return sorted({tuple(sorted((a, b))) for a, b in calls if (b, a) in calls})


def run(engines: int, depth: int, fanout: int, workdir: str) -> tuple:
    import psutil

    hookdir = os.path.join(workdir, "hook")
    os.makedirs(hookdir)
    with open(os.path.join(hookdir, "sitecustomize.py"), "w") as f:
        f.write(
            "import os\nif os.environ.get('IPB_WALK_DIR'):\n"
            + "".join("    " + line + "\n" for line in HOOK.splitlines())
        )
    os.environ.update(
        IPB_WALK_DIR=workdir,
        IPB_WALK_PACKAGE=PACKAGE,
        PYTHONPATH=os.pathsep.join(p for p in (hookdir, os.environ.get("PYTHONPATH")) if p),
    )
    exec(compile(HOOK, "walk-hook", "exec"), {})  # this process: the client
    import ipyparallel_broadcast as ipb

    cluster = ipb.Cluster(n=engines, depth=depth, fanout=fanout, log_level=40)
    rc = cluster.start_and_connect_sync()
    try:
        view = rc.broadcast_view()
        view.apply_sync(max, 1, 2)  # warm-up: first-call setup stays out of the walk
        start = time.monotonic_ns()
        view.apply_sync(max, 1, 2)
        end = time.monotonic_ns()
        me = psutil.Process()
        procs = [me] + me.children(recursive=True)
        for p in procs:
            try:
                os.kill(p.pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 30
        python = [p.pid for p in procs if _is_python(p)]
        while time.monotonic() < deadline and not all(
            os.path.exists(os.path.join(workdir, f"{pid}.json")) for pid in python
        ):
            time.sleep(0.1)
    finally:
        rc.close()
        cluster.stop_cluster_sync()
    records = []
    for name in os.listdir(workdir):
        if name.endswith(".json"):
            with open(os.path.join(workdir, name)) as f:
                rec = json.load(f)
            rec["client"] = rec["pid"] == os.getpid()
            records.append(rec)
    return walk(records, start, end), (end - start) / 1e6


def _is_python(p) -> bool:
    try:
        return "python" in os.path.basename(p.exe())
    except Exception:
        return False


def table(rows: list) -> list:
    lines = [
        "| process | package files, in the order the call runs them | files | back and forth |",
        "|---|---|---:|---|",
    ]
    seen = set()
    for r in rows:
        key = (r["role"].split(" ")[0] if r["role"] == "engine" else r["role"], tuple(r["files"]))
        if key in seen:  # engines that ran the same walk: one row
            continue
        seen.add(key)
        bf = back_and_forth(r["calls"])
        order = " → ".join(f"`{f}`" for f in r["files"])
        lines.append(
            f"| {r['role']} | {order} | {len(set(r['files']))} | {', '.join('⇄'.join(p) for p in bf) or 'none'} |"
        )
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--depth", type=int, default=1)
    ap.add_argument("--fanout", type=int, default=2)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ipb-walk-") as workdir:
        rows, ms = run(args.engines, args.depth, args.fanout, workdir)
    print(f"one coalesced apply_sync, {args.engines} engines, depth {args.depth}: {ms:.1f} ms")
    print("\n".join(table(rows)))
    return rows


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
