"""Big pushes across hosts at a capped link rate (issue 31's table), on the NetBed.

    python benchmarks/scripts/bigpush_bed.py --hosts 8 --per-host 4 --rate 200mbit --sizes 16,64 \\
        --out benchmarks/results/bigpush-8x4-200mbit.md

The controller and the client share the bed's controller host (the client
runs there, driven from this process through a pipe), and every host's link,
the controller's too, is capped with ``tc tbf`` both ways. For each system
and size: the push's wall time (median of ``--reps``) against the wire floor
M/B (one copy over one link), the bytes that left the controller host, and
the memory gained by the busiest engine host (PSS over its processes, every
engine having read the array), in multiples of M; and a 1 kB echo.
Systems: ours (BroadcastView through the host relays, big buffers in
chunks host to host), the star (ours with ``host_chunks`` off), DirectView on the
same cluster, IPython Parallel's BroadcastView on a stock cluster, and Dask's
``scatter(broadcast=True)`` (a scheduler beside the client, ``--per-host``
single-threaded workers on each engine host; its active memory manager off, as
it would drop the broadcast's replicas while they are made). MPI (mpi4py over MPICH) is not
run here: it needs MPICH's launcher to start ranks inside the namespaces
(see docs/bigdata.md).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
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
    import json, sys, time
    import numpy as np
    import ipyparallel as ipp
    from ipyparallel_broadcast.client.client import Client

    path, system, n, wanted = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4].split(",")


    class DaskView:  # scatter(broadcast=True), as a view's push
        def __init__(self, address):
            from distributed import Client as DaskClient
            self.client = DaskClient(address)
            self.client.wait_for_workers(n, timeout=600)
            self.future = None

        def apply_sync(self, f, *args):
            return list(self.client.run(f, *args).values())

        def push(self, ns, block=True):
            # hash=False: a fresh key each time (equal arrays hash alike, and a key
            # scattered again while its release is under way stays held)
            self.future = self.client.scatter(ns["big"], broadcast=True, hash=False)

        def execute(self, code, block=True):
            if code.startswith("del"):
                self.future.release()
                self.future = None
                while any(self.client.run(lambda dask_worker=None: len(dask_worker.data)).values()):
                    time.sleep(0.05)
            else:
                key = self.future.key
                self.client.run(lambda dask_worker=None: float(dask_worker.data[key].sum()))


    if system == "dask":
        views = {"Dask scatter(broadcast=True)": DaskView(path)}
    elif system == "star":
        rc = Client(path)
        rc.wait_for_engines(n, timeout=600)
        views = {"ours, star (no chunks)": rc.broadcast_view()}
    else:
        rc = (ipp.Client if system == "stock" else Client)(path)
        rc.wait_for_engines(n, timeout=600)
        views = {"ipp BroadcastView": rc.broadcast_view(is_coalescing=True)} if system == "stock" else \\
            {"ours": rc.broadcast_view(), "DirectView": rc[:]}

    views = {k: v for k, v in views.items() if wanted == ["all"] or k in wanted}
    for v in views.values():
        v.apply_sync(lambda: 0)
    print(json.dumps(list(views)), flush=True)
    for line in sys.stdin:
        name, what, size = json.loads(line)
        view = views[name]
        if what == "push":
            data = np.ones(size // 8)
            tic = time.perf_counter()
            view.push(dict(big=data), block=True)
            out = time.perf_counter() - tic
            view.execute("_ = float(big.sum())", block=True)  # every engine reads every page
        elif what == "trace":  # one traced push: where its chunks were when
            data = np.ones(size // 8)
            with view.temp_flags(trace=True):
                ar = view.push(dict(big=data), block=False)
            ar.get()
            events = ar.trace
            t0 = min(e["time"] for e in events if e["where"] == "client" and e["event"] == "request out")
            kept = ("request in", "request out", "chunks out", "first chunk in", "chunks in", "reply out", "done")
            out = [[e["where"], e["event"], (e["time"] - t0) * 1e3, e["detail"]] for e in events if e["event"] in kept]
        elif what == "drop":
            view.execute("del big", block=True)
            out = 0
        else:
            echo = np.zeros(1024, dtype=np.uint8)
            tic = time.perf_counter()
            view.apply_sync(lambda x: x, echo)
            out = time.perf_counter() - tic
        print(json.dumps(out), flush=True)
""")


def pss(pids) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                total += sum(int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:"))
        except OSError:
            pass
    return total


def start_system(stack: ExitStack, bed: NetBed, system: str, per_host: int, depth: int = 0, extra=()) -> str:
    """Start ``system`` on the bed; the address its client connects to."""
    if system == "dask":
        port = 8786
        log = stack.enter_context(open(os.devnull, "wb"))
        # the active memory manager (on by default) drops the replicas that
        # scatter(broadcast=True) makes while it is still making them: the push livelocks
        env = dict(os.environ, DASK_DISTRIBUTED__SCHEDULER__ACTIVE_MEMORY_MANAGER__START="False")
        procs = [
            bed.popen(
                bed.controller,
                [
                    sys.executable,
                    "-m",
                    "distributed.cli.dask_scheduler",
                    "--host",
                    bed.controller.addr,
                    "--port",
                    str(port),
                    "--no-dashboard",
                ],
                stdout=log,
                stderr=log,
                env=env,
            )
        ]
        procs += [
            bed.popen(
                h,
                [
                    sys.executable,
                    "-m",
                    "distributed.cli.dask_worker",
                    f"tcp://{bed.controller.addr}:{port}",
                    "--nworkers",
                    str(per_host),
                    "--nthreads",
                    "1",
                    "--no-dashboard",
                    "--host",
                    h.addr,
                ],
                stdout=log,
                stderr=log,
            )
            for h in bed.hosts
        ]
        for p in procs:  # each leads its own process group: its workers go too
            stack.callback(p.wait)
            stack.callback(os.killpg, p.pid, signal.SIGKILL)
        return f"tcp://{bed.controller.addr}:{port}"
    stock = system == "stock"
    args = ["--BroadcastController.host_chunks=False"] if system == "star" else []
    args += list(extra) if system in ("ours", "star") else []
    cluster = stack.enter_context(BedCluster(bed, depth=1 if stock else depth, stock=stock, controller_args=args))
    for host in bed.hosts:
        cluster.start_engines(host, per_host, kind="stock" if stock else "broadcast")
    return cluster._file("client")


def measure_system(args, system: str, hosts: int) -> dict:
    n = hosts * args.per_host
    rows = {}
    with ExitStack() as stack:
        bed = stack.enter_context(NetBed(hosts=hosts))
        for host in [bed.controller] + bed.hosts:
            bed.limit(host, args.rate)
        drive = Driver(
            bed,
            DRIVER,
            [start_system(stack, bed, system, args.per_host, args.depth, args.controller_arg), system, n, args.views],
        )
        try:
            for name in drive.views:
                for mib in args.sizes:
                    size = mib << 20
                    times, out, mem = [], [], []
                    for _ in range(args.reps):
                        start_out = bed.link_bytes(bed.controller)[1]
                        start_mem = [pss(bed.pids(h)) for h in bed.hosts]
                        times.append(drive(name, "push", size))
                        out.append((bed.link_bytes(bed.controller)[1] - start_out) / size)
                        mem.append(max(pss(bed.pids(h)) - m for h, m in zip(bed.hosts, start_mem)) / size)
                        drive(name, "drop")
                    if args.trace:
                        rows[name, hosts, mib, "trace"] = drive(name, "trace", size)
                        drive(name, "drop")
                    rows[name, hosts, mib] = dict(
                        push=statistics.median(times),
                        each=times,
                        out=statistics.median(out),
                        mem=statistics.median(mem),
                    )
                echoes = [drive(name, "echo") for _ in range(20)]
                rows[name, hosts, "echo"] = statistics.median(echoes)
        finally:
            drive.close()
    return rows


def trace_lines(name: str, mib: int, events: list, floor: float) -> list[str]:
    """One traced push, hop by hop: when each host's first chunk came and when
    it had them all (ms since the client sent it), and the gaps between hosts."""
    plan = next((e[3] for e in events if e[1] == "chunks out"), None) or {}
    at = {}
    for where, what, ms, _ in events:
        at.setdefault(where, {})[what] = ms
    hosts = sorted((w for w in at if "first chunk in" in at[w]), key=lambda w: at[w]["first chunk in"])
    lines = [
        "",
        f"One traced push of {mib} MiB ({name}): {plan.get('shape')}, {plan.get('chunks')} chunks of "
        f"{(plan.get('chunk') or 0) >> 10} KiB, planned for {(plan.get('link') or 0) / 1e6:.0f} Mbit/s; "
        f"floor {floor * 1e3:.0f} ms. Times in ms since the client sent it.",
        "",
        "| host | first chunk in | +hop | all chunks in | +hop | reply out |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for w in sorted((w for w in at if not w.startswith("host") and w != "client"), key=lambda w: min(at[w].values())):
        steps = ", ".join(f"{what} {ms:.1f}" for what, ms in sorted(at[w].items(), key=lambda kv: kv[1]))
        lines.append(f"| {w}: {steps} | | | | | |")
    before = next((at[w]["chunks out"] for w in at if "chunks out" in at[w]), 0.0), None
    for w in hosts:
        first, full = at[w]["first chunk in"], at[w].get("chunks in", float("nan"))
        gap_full = "" if before[1] is None else f"{full - before[1]:.1f}"
        lines.append(
            f"| {w} | {first:.1f} | {first - before[0]:.1f} | {full:.1f} | {gap_full} | "
            f"{at[w].get('reply out', float('nan')):.1f} |"
        )
        before = first, full
    done = next((at[w]["done"] for w in at if "done" in at[w]), None)
    if done is not None:
        lines.append(f"| client: every reply in | | | | | {done:.1f} |")
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="8", help="engine hosts, comma-separated: one bed each")
    parser.add_argument("--per-host", type=int, default=4)
    parser.add_argument("--rate", default="200mbit")
    parser.add_argument("--sizes", default="16,64", help="MiB, comma-separated")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--systems", default="ours,star,stock,dask")
    parser.add_argument("--depth", type=int, default=0, help="our tree's depth (1: the default tree)")
    parser.add_argument("--views", default="all", help="the views to time, by name (default: every system's)")
    parser.add_argument(
        "--controller-arg", action="append", default=[], help="a setting for our controller (repeatable)"
    )
    parser.add_argument("--trace", action="store_true", help="and one traced push per size: each hop's times")
    parser.add_argument("--out")
    parser.add_argument("--json", help="the rows as JSON too (for the notebook's plot)")
    args = parser.parse_args(argv)
    args.sizes = [int(s) for s in args.sizes.split(",")]
    host_counts = [int(h) for h in args.hosts.split(",")]
    why = NetBed.available()
    if why:
        parser.error(why)
    rows = {}
    for hosts in host_counts:
        for system in args.systems.split(","):
            rows.update(measure_system(args, system, hosts))
    rate = _rate_bits(args.rate) / 8
    lines = [
        f"NetBed: controller and client on one host, {args.hosts} engine hosts x {args.per_host} engines, "
        f"every link capped at {args.rate} each way (tbf). Ours: depth {args.depth}"
        f"{' (the root is the leaf)' if args.depth == 0 else ''}, a relay "
        f"per engine host, big buffers in pipelined chunks host to host (star: "
        f"host_chunks off, one whole copy from the leaf to each host); "
        f"stock: depth 1 (its depth-0 broadcast scheduler never answered on the bed). "
        f"Medians of {args.reps} pushes of a float64 array of M bytes; every engine then reads it all.",
        "Floor: M/B, one copy over one link. Out: bytes that left the controller host, in M. "
        "Host memory: PSS gained by the busiest engine host, in M.",
        "",
        "| system | hosts | M | push (s) | each (s) | x floor | out (x M) | host memory (x M) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    names = list(dict.fromkeys(key[0] for key in rows))
    table = []
    for name in names:
        for hosts in host_counts:
            for mib in args.sizes:
                r = rows[name, hosts, mib]
                floor = (mib << 20) / rate
                table.append(dict(system=name, hosts=hosts, mib=mib, floor=floor, **r))
                lines.append(
                    f"| {name} | {hosts} | {mib} MiB | {r['push']:.2f} | "
                    f"{' '.join(f'{t:.2f}' for t in r['each'])} | {r['push'] / floor:.2f} | "
                    f"{r['out']:.2f} | {r['mem']:.2f} |"
                )
    lines += ["", "| system | hosts | 1 kB echo (ms, median of 20) |", "|---|---:|---:|"]
    lines += [
        f"| {name} | {hosts} | {1e3 * rows[name, hosts, 'echo']:.1f} |" for name in names for hosts in host_counts
    ]
    for key, events in rows.items():
        if len(key) == 4:
            lines += trace_lines(key[0], key[2], events, (key[2] << 20) / rate)
    text = report("bigpush_bed.py", argv, f"Big pushes across {args.hosts} hosts at {args.rate}", lines, args.out)
    if args.json:
        from report import STARTED_AT, command

        echo = [dict(system=n, hosts=h, seconds=rows[n, h, "echo"]) for n in names for h in host_counts]
        with open(args.json, "w") as f:
            json.dump(
                dict(
                    command=command("bigpush_bed.py", argv),
                    commit=STARTED_AT,
                    rate=args.rate,
                    per_host=args.per_host,
                    rows=table,
                    echo=echo,
                ),
                f,
                indent=1,
            )
    return text


if __name__ == "__main__":
    main()
