"""New clients under IOPub load: how many executes lose their output.

    python benchmarks/scripts/iopub_joiners.py --clients 500 --out FILE

Every engine prints from a background thread each millisecond. Clients
connect one after another; each runs one ``execute("print(token)")`` through a
DirectView and one through a BroadcastView (reply modes in turn), then
``wait_for_output(20)``, and counts the engines whose output lacks its token.
Three systems, each on a local cluster of ``--engines`` engines:
- **ours**: our Client on our controller (it waits for its hello first);
- **ours, no wait**: the same with ``iopub_timeout = 0`` (the wait skipped:
  what the hello prevents);
- **ours, host relay**: our Client; the engines behind a host relay
  (``BroadcastEngine.host_relay = "always"``), their outputs through it;
- **stock**: IPython Parallel's Client on its own controller (DirectView only,
  twice per client, so the counts compare).
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile
import time

import ipyparallel as ipp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import report  # noqa: E402

import ipyparallel_broadcast as ipb  # noqa: E402
from ipyparallel_broadcast.tools.bench import chatter, our_cluster  # noqa: E402


def missed(ar, token) -> int:
    ar.get(timeout=60)
    ar.wait_for_output(20)
    return sum(token not in out for out in ar.stdout)


def run_clients(url_file, n, make, views) -> dict:
    """{executes, missed, connect_ms (median)}."""
    modes = [True, False, ipb.Batch(2)]
    executes = misses = 0
    waits = []
    for k in range(n):
        tic = time.perf_counter()
        client = make(url_file)
        waits.append(time.perf_counter() - tic)
        try:
            for j, kind in enumerate(views):
                view = client[:] if kind == "direct" else client.broadcast_view(coalescing=modes[k % 3])
                token = f"hello {k}.{j}"
                misses += missed(view.execute(f"print({token!r})", block=False), token)
                executes += 1
        finally:
            client.close()
    waits.sort()
    return dict(executes=executes, missed=misses, connect_ms=1e3 * waits[len(waits) // 2])


def ours_no_wait(url_file):
    from traitlets.config import Config

    config = Config()
    config.Client.iopub_timeout = 0.0
    return ipb.Client(url_file, config=config)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=500)
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    rows = {}
    with our_cluster(args.engines, 1, 2) as (rc, cluster):
        rc[:].apply_sync(chatter)
        (url_file,) = glob.glob(os.path.join(cluster.profile_dir, "security", "*-client.json"))
        rows["ours"] = run_clients(url_file, args.clients, ipb.Client, ["direct", "broadcast"])
        rows["ours, no wait"] = run_clients(url_file, args.clients, ours_no_wait, ["direct", "broadcast"])
    from traitlets.config import Config

    behind = Config()
    behind.BroadcastEngine.host_relay = "always"
    with our_cluster(args.engines, 1, 2, config=behind) as (rc, cluster):
        assert rc.broadcast_stats() and any(n.get("hosts") for n in rc.broadcast_stats()), "no host relay"
        rc[:].apply_sync(chatter)
        (url_file,) = glob.glob(os.path.join(cluster.profile_dir, "security", "*-client.json"))
        rows["ours, host relay"] = run_clients(url_file, args.clients, ipb.Client, ["direct", "broadcast"])
    with tempfile.TemporaryDirectory() as profile_dir:
        stock = ipp.Cluster(n=args.engines, profile_dir=profile_dir, log_level=40)
        src = stock.start_and_connect_sync()
        try:
            src.wait_for_engines(args.engines, timeout=120)
            src[:].apply_sync(chatter)
            (url_file,) = glob.glob(os.path.join(profile_dir, "security", "*-client.json"))
            rows["stock"] = run_clients(url_file, args.clients, ipp.Client, ["direct", "direct"])
        finally:
            src.close()
            stock.stop_cluster_sync()
    lines = [
        f"{args.engines} engines each printing every millisecond; {args.clients} new clients in turn, "
        "each with two executes (ours: DirectView and BroadcastView; stock: DirectView twice).",
        "",
        "| system | executes | executes' engines whose output did not come | connect (median) |",
        "|---|---|---|---|",
    ]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['executes']} | {r['missed']} | {r['connect_ms']:.1f} ms |")
    report("iopub_joiners.py", argv, "New clients under IOPub load: outputs missed", lines, args.out)


if __name__ == "__main__":
    main()
