"""Reduce and allreduce of big arrays across hosts at a capped link rate, on the NetBed.

    python benchmarks/scripts/reduce_bed.py --hosts 8 --per-host 4 --rate 200mbit --sizes 16 \\
        --out benchmarks/results/reduce-bed-8x4-200mbit.md

The controller and the client share the bed's controller host (the client
runs there, driven from this process through a pipe); every host's link is
capped with ``tc tbf`` both ways. Every engine holds ``big``, a float64 array
of M bytes of its own. For each view and size: the call's wall time (median of
``--reps``) against the wire floor M/B (one array over one link), and the
bytes that entered the controller host during the call, in M.

- reduce: the element-wise sum reaches the client. Ours: ``view.reduce``
  (at ``--depths``; 1 is the default tree); DirectView: pull (an apply
  returning the array) and sum on the client.
- allreduce: the sum lands in every engine as ``total``. Ours:
  ``view.allreduce``; DirectView: pull, sum and push.
- gather: ``--gather`` MiB in all (an equal part on each engine) joined at the
  client, by each view's ``gather``; its floor is the total over one link.
- pull (``--pull``): one engine's ``big`` (on the last host) to the client, by
  each view's ``pull``; its floor is M/B.
- ``--stock``: IPython Parallel's BroadcastView too, on a stock cluster of the
  same hosts (its controller and ``ipengine``s; depth 1), at ``--peer-sizes``:
  reduce and allreduce as DirectView's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import textwrap
from contextlib import ExitStack

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bedclient import Driver  # noqa: E402
from report import report  # noqa: E402

from ipyparallel_broadcast.tools.bedcluster import BedCluster  # noqa: E402
from ipyparallel_broadcast.tools.netbed import NetBed, _rate_bits  # noqa: E402

DRIVER = textwrap.dedent("""
    import functools, json, sys, time
    import numpy as np
    import ipyparallel as ipp
    from ipyparallel_broadcast.client.client import Client

    path, n, views_wanted = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
    if views_wanted == ["ipp BroadcastView"]:  # a stock cluster: IPython Parallel's own view
        rc = ipp.Client(path)
        rc.wait_for_engines(n, timeout=900)
        views = {"ipp BroadcastView": rc.broadcast_view(is_coalescing=True, block=True)}
    else:
        rc = Client(path)
        rc.wait_for_engines(n, timeout=900)
        views = {"ours": rc.broadcast_view(block=True), "DirectView": rc[:]}
        views["DirectView"].block = True
        views = {k: v for k, v in views.items() if k in views_wanted}

    @ipp.interactive
    def value():
        return big

    @ipp.interactive
    def check():
        return float(total[0]) + float(total[-1])

    for v in views.values():
        v.apply_sync(lambda: 0)
    print(json.dumps(list(views)), flush=True)
    for line in sys.stdin:
        name, what, size = json.loads(line)
        view = views[name]
        if what == "make":
            view.execute(f"import numpy as np; big = np.random.default_rng().random({size // 8})")
            out = 0
        elif what == "part":  # a gather's: size bytes in all
            view.execute(f"import numpy as np; part = np.random.default_rng().random({size // 8 // n})")
            out = 0
        elif what == "pull":
            tic = time.perf_counter()
            got = view.pull("big", targets=[n - 1], block=True) if name == "ours" else rc[n - 1].pull("big", block=True)
            out = time.perf_counter() - tic
            assert np.asarray(got).nbytes == size
        elif what == "gather":
            tic = time.perf_counter()
            got = view.gather("part", block=True)
            out = time.perf_counter() - tic
            assert got.nbytes == size // 8 // n * 8 * n
        else:
            tic = time.perf_counter()
            if name == "ours" and what == "reduce":
                view.reduce(value, op="sum")
            elif name == "ours":
                view.allreduce(value, op="sum", name="total")
            else:
                s = functools.reduce(np.add, view.apply_sync(value))
                if what == "allreduce":
                    view.push(dict(total=s))
            out = time.perf_counter() - tic
            if what == "allreduce":
                assert len(set(view.apply_sync(check))) == 1
        print(json.dumps(out), flush=True)
""")


def measure(args, depth: int, views: str, shape: str = "auto") -> dict:
    n = args.hosts * args.per_host
    stock = views == "ipp BroadcastView"
    rows = {}
    with ExitStack() as stack:
        bed = stack.enter_context(NetBed(hosts=args.hosts))
        for host in [bed.controller] + bed.hosts:
            bed.limit(host, args.rate)
        extra = [f"--BroadcastController.host_chunk_size={args.chunk << 10}"] if args.chunk else []
        extra += [f"--BroadcastController.host_reduce_shape={shape}"] if shape != "auto" else []
        ours = f"ours, depth {depth}" + (f", {shape}" if shape != "auto" else "")
        cluster = stack.enter_context(BedCluster(bed, depth=depth, controller_args=extra, stock=stock))
        for host in bed.hosts:
            cluster.start_engines(host, args.per_host, kind="stock" if stock else "broadcast")
        drive = Driver(bed, DRIVER, [cluster._file("client"), n, views])
        try:
            for mib in args.sizes if not stock else [m for m in args.sizes if m in args.peer_sizes]:
                size = mib << 20
                drive(drive.views[0], "make", size)
                for name in [v for v in drive.views if v == "ours" or mib in args.peer_sizes]:
                    label = ours if name == "ours" else name
                    pull = ("pull",) if args.pull and not stock else ()
                    for what in ("reduce", "allreduce") + pull:
                        times, into = [], []
                        for _ in range(args.reps):
                            before = bed.link_bytes(bed.controller)[0]
                            times.append(drive(name, what, size))
                            into.append((bed.link_bytes(bed.controller)[0] - before) / size)
                        rows[label, what, mib] = dict(
                            seconds=statistics.median(times), each=times, into=statistics.median(into)
                        )
                        print(label, what, mib, rows[label, what, mib], file=sys.stderr, flush=True)
            for mib in args.gather if not stock else []:
                size = mib << 20
                drive(drive.views[0], "part", size)
                for name in [v for v in drive.views if v == "ours" or mib in args.peer_sizes]:
                    label = ours if name == "ours" else name
                    times, into = [], []
                    for _ in range(args.reps):
                        before = bed.link_bytes(bed.controller)[0]
                        times.append(drive(name, "gather", size))
                        into.append((bed.link_bytes(bed.controller)[0] - before) / size)
                    rows[label, "gather (M in all)", mib] = dict(
                        seconds=statistics.median(times), each=times, into=statistics.median(into)
                    )
        finally:
            drive.close()
    return rows


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--per-host", type=int, default=4)
    parser.add_argument("--rate", default="200mbit")
    parser.add_argument("--sizes", default="16", help="MiB per engine, comma-separated")
    parser.add_argument("--gather", default="16,64", help="gather: MiB in all, comma-separated")
    parser.add_argument("--peer-sizes", default="16", help="the sizes DirectView runs at too (it is slow)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--depths", default="1,0", help="our tree's depths; DirectView runs on the first")
    parser.add_argument("--pull", action="store_true", help="also time a pull of one engine's array")
    parser.add_argument(
        "--stock", action="store_true", help="also IPython Parallel's BroadcastView (a stock cluster, depth 1)"
    )
    parser.add_argument("--chunk", type=int, default=0, help="KiB per chunk between hosts (default: the controller's)")
    parser.add_argument(
        "--shapes", default="auto", help="a reduce's way between hosts (host_reduce_shape), comma-separated"
    )
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    args.sizes = [int(s) for s in args.sizes.split(",")]
    args.gather = [int(s) for s in args.gather.split(",") if s]
    args.peer_sizes = [int(s) for s in args.peer_sizes.split(",") if s]
    why = NetBed.available()
    if why:
        parser.error(why)
    rows = {}
    configs = [(int(d), shape) for d in args.depths.split(",") for shape in args.shapes.split(",")]
    for i, (depth, shape) in enumerate(configs):
        rows.update(measure(args, depth, "ours,DirectView" if i == 0 and args.peer_sizes else "ours", shape))
    if args.stock:  # (its depth-0 broadcast scheduler never answered on the bed: see bigpush_bed.py)
        rows.update(measure(args, 1, "ipp BroadcastView"))
    rate = _rate_bits(args.rate) / 8
    lines = [
        f"NetBed: controller and client on one host, {args.hosts} engine hosts x {args.per_host} engines, "
        f"every link capped at {args.rate} each way (tbf); a relay per engine host. Medians of {args.reps} "
        "calls; every engine holds a float64 array of M bytes.",
        "Floor: M/B, one array over one link (a gather: the total over one link; a pull: one engine's array). "
        "In: bytes that entered the controller host during the call, in M.",
        "",
        "| view | call | M | time (s) | each (s) | x floor | in (x M) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for (label, what, mib), r in rows.items():
        floor = (mib << 20) / rate
        lines.append(
            f"| {label} | {what} | {mib} MiB | {r['seconds']:.2f} | "
            f"{' '.join(f'{t:.2f}' for t in r['each'])} | {r['seconds'] / floor:.2f} | {r['into']:.2f} |"
        )
    report("reduce_bed.py", argv, f"Reduce and allreduce across {args.hosts} hosts at {args.rate}", lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
