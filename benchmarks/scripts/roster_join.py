"""Clients made while simulated engines register: do they see every engine,
and how soon after the last registration does ``wait_for_engines`` return?

Each run starts a controller, a witness client (connected before any engine,
it notes when the hub's last registration reached it), and a farm of
simulated hosts; as soon as the farm has its registration replies (the hub is
still finishing them), one of our clients and one stock ``ipp.Client`` are
made, and each waits for every engine.

    python benchmarks/scripts/roster_join.py --engines 1024 --hosts 16 --runs 16 --out FILE
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile
import threading
import time

import ipyparallel as ipp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import report  # noqa: E402

from ipyparallel_broadcast import Client, Cluster  # noqa: E402
from ipyparallel_broadcast.tools.farm import HEARTBEATS  # noqa: E402
from ipyparallel_broadcast.tools.sim import SimEngines  # noqa: E402


def waited(client, n, timeout) -> float | None:
    """Seconds until ``client`` saw ``n`` engines, at the clock's time; None if never."""
    try:
        client.wait_for_engines(n, timeout=timeout)
    except (TimeoutError, Exception):
        return None
    return time.monotonic()


def one_run(n: int, hosts: int, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="ipb-roster-") as profile_dir:
        cluster = Cluster(n=0, depth=1, fanout=2, profile_dir=profile_dir, log_level=40, controller_args=HEARTBEATS)
        cluster.start_controller_sync()
        witness = cluster.connect_client_sync()
        heard = threading.Thread(target=lambda: last.append(waited(witness, n, timeout + n / 10)))
        last: list = []
        heard.start()  # returns as the hub's last registration reaches the witness
        (engine_file,) = glob.glob(os.path.join(profile_dir, "security", "*-engine.json"))
        (client_file,) = glob.glob(os.path.join(profile_dir, "security", "*-client.json"))
        farm = SimEngines(engine_file, n, per_process=-(-n // hosts), hosts=True)
        try:
            farm.start(timeout=max(120, n / 10))
            made = time.monotonic()
            done: dict = {}

            def join(kind, make):  # each client made and waited for on a thread of its own, at once
                client = done[kind + " client"] = make(client_file, timeout=60)
                if kind == "ours":
                    done["at return"] = len(client.ids)
                done[kind] = waited(client, n, timeout)

            waits = [threading.Thread(target=join, args=kind) for kind in (("stock", ipp.Client), ("ours", Client))]
            for w in waits:
                w.start()
            for w in waits:
                w.join()
            ours_done, stock_done = done["ours"], done["stock"]
            heard.join()

            def lag_of(done):
                return None if done is None or last[-1] is None else max(0.0, done - last[-1])

            row = dict(
                ours=ours_done is not None,
                stock=stock_done is not None,
                at_return=done.get("at return", 0),
                made=(last[-1] or made) - made,
                lag=lag_of(ours_done),
                stock_lag=lag_of(stock_done),
            )
            for kind in ("ours", "stock"):
                if kind + " client" in done:
                    done[kind + " client"].close()
            return row
        finally:
            witness.close()
            farm.stop()
            cluster.stop_cluster_sync()


def safe_run(n: int, hosts: int, timeout: float) -> dict:
    """One run; one whose client could not even connect counts as not seeing every engine."""
    try:
        return one_run(n, hosts, timeout)
    except Exception as e:  # (a connection request the hub did not answer in time, say)
        print(f"run failed: {e!r}", file=sys.stderr)
        return dict(ours=False, stock=False, at_return=0, made=float("nan"), lag=None, stock_lag=None)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, nargs="+", default=[1024])
    parser.add_argument("--hosts", type=int, nargs="+", default=[16], help="simulated hosts, one per engine count")
    parser.add_argument("--runs", type=int, nargs="+", default=[16], help="runs, one per engine count")
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    lines = [
        "One run: a controller, a witness client, a farm of simulated hosts; one of our clients",
        "and one stock `ipp.Client` made at once (each on a thread, with a 60 s connect timeout) as",
        "soon as the farm has its registration replies (the hub",
        "still finishing them). 'all': `wait_for_engines(N)` returned within "
        f"{args.timeout:.0f} s; 'ids then': our client's `len(rc.ids)` when `Client()` returned;",
        "'last reg.': seconds from the clients' making to the hub's last registration (as the",
        "witness heard it); 'lag': from then to each client's `wait_for_engines` returning (ours; stock).",
        "All three clients are in one process, on a machine the farm keeps busy.",
        "",
        "| engines / hosts | run | ours all | stock all | ids then | last reg. (s) | lag (s) | stock lag (s) |",
        "|---|---:|---|---|---:|---:|---:|---:|",
    ]
    totals = []
    for n, hosts, runs in zip(args.engines, args.hosts, args.runs, strict=True):
        rows = [safe_run(n, hosts, args.timeout) for _ in range(runs)]
        for i, r in enumerate(rows, 1):
            lag, stock_lag = ("never" if v is None else f"{v:.3f}" for v in (r["lag"], r["stock_lag"]))
            lines.append(
                f"| {n} / {hosts} | {i} | {'yes' if r['ours'] else 'no'} | {'yes' if r['stock'] else 'no'} "
                f"| {r['at_return']} | {r['made']:.2f} | {lag} | {stock_lag} |"
            )
            print(lines[-1], flush=True)
        lags = [r["lag"] for r in rows if r["lag"] is not None]
        totals.append(
            f"| {n} / {hosts} | {sum(r['ours'] for r in rows)} of {runs} | {sum(r['stock'] for r in rows)} of {runs} "
            f"| {max(lags):.3f} |"
            if lags
            else f"| {n} / {hosts} | 0 of {runs} | {sum(r['stock'] for r in rows)} of {runs} | never |"
        )
    lines += ["", "| engines / hosts | ours saw all | stock saw all | worst lag (s) |", "|---|---|---|---:|", *totals]
    report("roster_join.py", argv, "Clients made while engines register", lines, args.out)


if __name__ == "__main__":
    main()
