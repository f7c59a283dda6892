"""How fast failures across hosts are handled, on the NetBed (needs root).

    python benchmarks/scripts/multihost_failures.py --hosts 3 --per-host 3 --reps 3

On one cluster (a controller host and ``--hosts`` engine hosts), for each
reply mode, ``--reps`` times each:
- *relay killed*: a call that waits on a gate file is in flight; the relay of
  one host is SIGKILLed and the gate opened. Measured from the kill: when the
  call is complete (the victim's engines failed naming it, the others'
  results in), and when a call to the victim's engines succeeds again.
- *link down*: the same, with the last host's link taken down instead
  (``ip link set ... down``); measured from the cut: when the call is
  complete. That host's engines are gone for good (the hub drops them), so
  this runs once per mode, one host each, on a bed with enough hosts.
The report starts with the command and the commit.
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

from ipyparallel_broadcast.tools.bedcluster import BedCluster  # noqa: E402
from ipyparallel_broadcast.tools.netbed import NetBed  # noqa: E402

MODES = {"coalescing": True, "streaming": False}


def gate_until(path):
    import os
    import time

    while not os.path.exists(path):
        time.sleep(0.01)
    return os.getpid()


def relays(rc):
    return {n["host"]: n for n in rc.broadcast_stats() if n.get("host")}


def wait(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("gave up waiting")
        time.sleep(0.01)


def relay_killed(rc, coalescing, gate) -> tuple:
    label, victim = sorted(relays(rc).items())[0]
    ar = rc.broadcast_view(coalescing=coalescing).apply_async(gate_until, gate)
    tic = time.monotonic()
    os.kill(victim["pid"], signal.SIGKILL)
    open(gate, "w").close()
    results = ar.get(timeout=60, return_exceptions=True)
    done = time.monotonic() - tic
    assert sum(isinstance(r, Exception) for r in results) == len(victim["eids"]), results

    def back():
        try:
            return rc.broadcast_view(victim["eids"]).apply_sync(lambda: 1) == [1] * len(victim["eids"])
        except Exception:
            return False

    wait(back)
    os.unlink(gate)
    return done, time.monotonic() - tic


def link_down(bed, rc, host, coalescing, gate) -> float:
    ar = rc.broadcast_view(coalescing=coalescing).apply_async(gate_until, gate)
    tic = time.monotonic()
    bed.set_link(host, False)
    open(gate, "w").close()
    ar.get(timeout=60, return_exceptions=True)
    done = time.monotonic() - tic
    os.unlink(gate)
    return done


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--per-host", type=int, default=3)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if NetBed.available():
        parser.error(NetBed.available())
    if args.hosts < len(MODES) + 1:
        parser.error(f"--hosts must be at least {len(MODES) + 1}: each link-down run loses a host")
    rows = []
    gate = os.path.join(tempfile.mkdtemp(prefix="ipb-gate-"), "gate")
    with NetBed(hosts=args.hosts) as bed, BedCluster(bed) as cluster:
        for host in bed.hosts:
            cluster.start_engines(host, args.per_host)
        rc = cluster.client(wait_for=args.hosts * args.per_host)
        for mode, coalescing in MODES.items():
            runs = [relay_killed(rc, coalescing, gate) for _ in range(args.reps)]
            rows.append(
                (
                    f"host relay killed mid-call, {mode}",
                    statistics.median(r[0] for r in runs),
                    statistics.median(r[1] for r in runs),
                    len(runs),
                )
            )
        for (mode, coalescing), host in zip(MODES.items(), reversed(bed.hosts)):
            rows.append((f"host link down mid-call, {mode}", link_down(bed, rc, host, coalescing, gate), None, 1))
    n = args.hosts * args.per_host
    lines = [
        "NetBed; controller defaults (heartbeats 0.8 s x 3, node_timeout 10 s); seconds from the kill or the cut.",
        "",
        "| event | call complete (s) | victim's engines reachable again (s) | runs |",
        "|---|---:|---:|---:|",
    ]
    for what, done, back, runs in rows:
        lines.append(f"| {what} | {done:.2f} | {'-' if back is None else f'{back:.2f}'} | {runs} |")
    report("multihost_failures.py", argv, f"Failures across hosts: {n} engines on {args.hosts} hosts", lines, args.out)


if __name__ == "__main__":
    main()
