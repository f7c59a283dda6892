"""Quick runner: our BroadcastView against DirectView and ipyparallel's own
BroadcastView, measured interleaved in one run.

    python -m ipyparallel_broadcast.tools.bench --engines 8 16 32 --depth 1
    python -m ipyparallel_broadcast.tools.bench --suite collectives --engines 32
    python -m ipyparallel_broadcast.tools.bench --engines 16 --peers
    python -m ipyparallel_broadcast.tools.bench --engines 16 --cpu 200

With ``--peers``, a local Dask cluster of N workers joins the rounds
(``Client.run`` and ``submit`` pinned per worker), and an MPI job of N+1
ranks (mpi4py ``bcast`` + ``gather``, timed inside the job) adds a row.

``--cpu CALLS`` adds where the CPU goes: after the rounds, each system is
started alone (the others stopped), each of its views makes CALLS 1 kB echo
calls, and each process's CPU clock (``cpu_seconds``) gives the CPU time of
the client process, the controller's processes (hub, schedulers, relay nodes)
and the engines (with their nannies; Dask's workers and nannies), each less
its idle rate (measured over 5 s at rest); shown per engine per apply, with
each system's idle CPU.

Two clusters run side by side with N engines each: ours (relay tree of the
given depth, fan-out 2) and a stock ipyparallel controller whose broadcast
scheduler has the same depth, 1 at least (``stock_depth``). Each round times every view once, in turn, so
drift hits all views alike; the table shows medians and ratios to DirectView
(< 1 is faster for latencies, > 1 is better for throughput).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack, contextmanager

import ipyparallel as ipp
import numpy as np
import psutil

from ..client.view import Batch, BroadcastView
from ..launch.launcher import Cluster
from . import peers, workloads

ECHO = np.ones(128)  # 1 kB
PUSH = np.ones(131072)  # 1 MB
MANY = 20
MAP_ITEMS = 10_000


def echo(x):
    return x


def cheap(x):
    return x + 1


@ipp.interactive
def local_array():
    return R  # noqa: F821  (pushed to every engine by prepare())


@contextmanager
def our_cluster(n: int, depth: int, fanout: int = 2, **cluster_options):
    """``(client, cluster)`` of a local cluster of ours with n engines, all
    registered; stopped (and its profile removed) afterwards."""
    with tempfile.TemporaryDirectory(prefix="ipb-bench-") as profile_dir:
        cluster = Cluster(n=n, depth=depth, fanout=fanout, profile_dir=profile_dir, log_level=40, **cluster_options)
        rc = cluster.start_and_connect_sync()
        try:
            rc.wait_for_engines(n, timeout=max(120, 4 * n))
            yield rc, cluster
        finally:
            rc.close()
            cluster.stop_cluster_sync()


def _register_wait(n: int) -> float:
    """Seconds for n engines to register: ~0.8 s each on 2 busy cores."""
    return max(60, 4 * n)


def stock_depth(depth: int) -> int:
    """A stock cluster's broadcast scheduler depth beside our ``depth``: at
    least 1, as IPython Parallel's client cannot read the replies of its own
    depth-0 broadcast scheduler (docs/upstream-issues.md) and the call hangs."""
    return max(depth, 1)


def _cluster(stack: ExitStack, side: str, n: int, depth: int, fanout: int = 2):
    """A cluster of n engines, not started: ours (``side`` "ours") or a stock
    one whose broadcast scheduler has the same depth, 1 at least ("stock")."""
    profile_dir = stack.enter_context(tempfile.TemporaryDirectory())
    if side == "ours":
        return Cluster(
            n=n, depth=depth, fanout=fanout, log_level=40, engine_timeout=_register_wait(n), profile_dir=profile_dir
        )
    return ipp.Cluster(
        n=n,
        log_level=40,
        engine_timeout=_register_wait(n),
        profile_dir=profile_dir,
        controller_args=[f"--IPController.broadcast_scheduler_depth={stock_depth(depth)}"],
    )


def _start(stack: ExitStack, sides, n: int, depth: int, fanout: int = 2) -> dict:
    """``{side: client}`` of a cluster per side, started in order, all engines registered."""
    clients = {}
    for side in sides:
        cluster = _cluster(stack, side, n, depth, fanout)
        rc = cluster.start_and_connect_sync()
        stack.callback(cluster.stop_cluster_sync)
        stack.callback(rc.close)
        clients[side] = rc
    for rc in clients.values():
        rc.wait_for_engines(n, timeout=_register_wait(n))
    return clients


def start_clusters(stack: ExitStack, n: int, depth: int, fanout: int = 2):
    """(our client, stock client) for two clusters of n engines each."""
    # the stock one first: with ours up, its 64 engines did not all register
    clients = _start(stack, ("stock", "ours"), n, depth, fanout)
    return clients["ours"], clients["stock"]


def views(ours, stock, suite="calls") -> dict[str, object]:
    """The views a table compares, by name: the stock cluster's, then ours
    (either client None: that side's views left out)."""
    vs = {}
    if stock is not None:
        vs["DirectView"] = stock[:]
        vs["ipp BroadcastView coalescing"] = stock.broadcast_view(is_coalescing=True)
        if suite not in ("collectives", "workloads"):  # (the same code path as coalescing there)
            vs["ipp BroadcastView non-coalescing"] = stock.broadcast_view(is_coalescing=False)
    if ours is not None:
        vs["ours coalescing"] = ours.broadcast_view(coalescing=True)
        vs["ours streaming"] = ours.broadcast_view(coalescing=False)
        vs["ours auto"] = ours.broadcast_view(coalescing="auto")
        if suite in ("collectives", "workloads"):
            vs["ours partial (Batch 8)"] = ours.broadcast_view(coalescing=Batch(8))
    return vs


def t_echo(view) -> float:
    tic = time.perf_counter()
    view.apply_sync(echo, ECHO)
    return time.perf_counter() - tic


def t_many(view, count: int = MANY) -> float:
    """Messages per engine per second (calls per second) for ``count`` async echoes."""
    tic = time.perf_counter()
    ars = [view.apply_async(echo, ECHO) for _ in range(count)]
    for ar in ars:
        ar.get()
    return count / (time.perf_counter() - tic)


def t_push(view) -> float:
    tic = time.perf_counter()
    view.push({"x": PUSH}, block=True)
    return time.perf_counter() - tic


def chunks(view) -> np.ndarray:
    """One 1 MB chunk per engine of the view."""
    return np.ones((len(view) * 128, 1024))


def t_scatter(view) -> float:
    data = chunks(view)
    tic = time.perf_counter()
    view.scatter("g", data, block=True)
    return time.perf_counter() - tic


def t_gather(view) -> float:
    tic = time.perf_counter()
    view.gather("g", block=True)
    return time.perf_counter() - tic


def t_map(view) -> float:
    tic = time.perf_counter()
    view.map_sync(cheap, range(MAP_ITEMS))
    return time.perf_counter() - tic


def t_reduce(view) -> float:
    """Sum of one 1 MB array per engine: in the tree for ours, else on the client."""
    tic = time.perf_counter()
    if isinstance(view, BroadcastView):
        view.reduce(local_array, op="sum", block=True)
    else:
        functools.reduce(np.add, view.apply_sync(local_array))
    return time.perf_counter() - tic


def t_allreduce(view) -> float:
    """The sum of one 1 MB array per engine, in every engine as ``S``: ours
    with ``allreduce``, else pulled, summed on the client and pushed back."""
    tic = time.perf_counter()
    if isinstance(view, BroadcastView):
        view.allreduce(local_array, op="sum", name="S", block=True)
    else:
        view.push({"S": functools.reduce(np.add, view.apply_sync(local_array))}, block=True)
    return time.perf_counter() - tic


SUITES: dict[str, dict[str, tuple]] = {
    # suite: {name: (function, unit, scale, higher_is_better)}
    "calls": {
        "echo 1kB": (t_echo, "ms", 1e3, False),
        "many msgs": (t_many, "msg/eng/s", 1.0, True),
        "push 1MB": (t_push, "ms", 1e3, False),
    },
    "collectives": {
        "scatter N x 1MB": (t_scatter, "ms", 1e3, False),
        "gather N x 1MB": (t_gather, "ms", 1e3, False),
        f"map {MAP_ITEMS} items": (t_map, "ms", 1e3, False),
        "reduce(sum) 1MB": (t_reduce, "ms", 1e3, False),
        "allreduce(sum) 1MB": (t_allreduce, "ms", 1e3, False),
    },
    "workloads": {  # IPython Parallel's examples, each the natural way (tools/workloads.py)
        name: (workloads.timed(fn), "ms", 1e3, False) for name, fn in workloads.WORKLOADS.items()
    },
}
MEASURES = SUITES["calls"]


WARM_CALLS = 5  # a collective's first calls of a size: 'auto' path tries each path twice


def prepare(vs: dict[str, object], suite: str):
    """Warm every view up (imports, connections), give engines their data, and
    let ours learn their collectives' paths (their first calls try both)."""
    for view in vs.values():
        t_echo(view)
        if suite == "collectives":
            view.execute("import numpy as np; R = np.ones(131072)", block=True)
            for _ in range(WARM_CALLS):
                for fn, *_rest in SUITES[suite].values():
                    fn(view)
        elif suite == "workloads":
            for fn in workloads.WORKLOADS.values():
                fn(view)
        else:
            t_push(view)


def measure(vs: dict[str, object], reps: int, suite: str = "calls") -> dict[str, dict[str, float]]:
    """Median of reps interleaved rounds, per measure and view."""
    prepare(vs, suite)
    return interleaved(vs, {m: fn for m, (fn, *_rest) in SUITES[suite].items()}, reps)


def interleaved(vs: dict[str, object], fns: dict[str, Callable], reps: int) -> dict[str, dict[str, float]]:
    """Each round runs every measure on every view in turn (drift hits all
    alike); the median of ``reps`` rounds, per measure and view."""
    samples: dict[str, dict[str, list[float]]] = {m: {v: [] for v in vs} for m in fns}
    for _ in range(reps):
        for m, fn in fns.items():
            for name, view in vs.items():
                samples[m][name].append(fn(view))
    return {m: {v: statistics.median(s) for v, s in by.items()} for m, by in samples.items()}


def table(n: int, depth: int, medians) -> str:
    names = list(next(iter(medians.values())))
    head = f"N={n} engines, our tree's depth {depth}, stock's broadcast scheduler's {stock_depth(depth)}"
    measures = next(s for s in SUITES.values() if set(s) == set(medians))
    cols = [f"{m} ({measures[m][1]})" for m in measures]
    width = max(len(x) for x in names) + 2
    lines = [head, "view".ljust(width) + "".join(c.rjust(28) for c in cols)]
    for name in names:
        cells = []
        for m, (_, _, scale, _) in measures.items():
            value = medians[m][name]
            ratio = value / medians[m]["DirectView"]
            cells.append(f"{value * scale:10.2f} ({ratio:5.2f}x DV)".rjust(28))
        lines.append(name.ljust(width) + "".join(cells))
    return "\n".join(lines)


def process_groups(rc, cluster) -> dict[str, list]:
    """The controller's processes and the engines' (nannies included)."""
    controller = psutil.Process(cluster.controller.process.pid)  # its keeper, the controller its child
    engines = [psutil.Process(pid) for pid in rc[:].apply_sync(os.getpid)]
    return {
        "controller": [controller] + controller.children(recursive=True),
        "engines": engines + [c for e in engines for c in e.children(recursive=True)],
    }


def dask_groups(client) -> dict[str, list]:
    """A local Dask cluster's processes: its scheduler and its nannies run in
    this (the client's) process; its worker processes are the engines."""
    workers = [psutil.Process(pid) for pid in client.run(os.getpid).values()]
    return {"controller": [], "engines": [w for w in workers if w.pid != os.getpid()]}


def process_cpu_clock(pid: int) -> int:
    """The clock id of process ``pid``'s CPU time, all its threads, live and
    gone, in ns: Linux's encoding of a process clock (``CPUCLOCK_SCHED``), as
    glibc's ``clock_getcpuclockid`` makes it (Python does not expose that call)."""
    return (~pid << 3) | 2


def cpu_seconds(procs) -> float:
    """CPU seconds (user + system) so far of ``procs`` (psutil processes), read
    on each process's CPU clock where there is one (ns: psutil reads 10 ms
    ticks, too coarse for a call's share), else from psutil; a process gone
    counts 0."""
    total = 0.0
    for proc in procs:
        try:
            total += time.clock_gettime(process_cpu_clock(proc.pid))
            continue
        except (OSError, AttributeError, OverflowError):
            pass
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            pass
    return total


PARTS = ("client", "controller", "engines")


def _cpu(procs: dict[str, list]) -> list[float]:
    """CPU seconds so far of this process (the client), the controller's and the engines'."""
    return [time.process_time(), cpu_seconds(procs["controller"]), cpu_seconds(procs["engines"])]


def idle_rates(groups: dict[str, dict[str, list]], seconds: float = 5.0) -> dict[str, list[float]]:
    """Each system's CPU seconds per second at rest (client, controller, engines):
    heartbeats, polls, Dask's ticks. Measured together: this process's share is
    common to all (every client lives here)."""
    before = {side: _cpu(procs) for side, procs in groups.items()}
    tic = time.perf_counter()
    time.sleep(seconds)  # the measurement window: nothing else runs
    elapsed = time.perf_counter() - tic
    return {side: [(a - b) / elapsed for a, b in zip(_cpu(procs), before[side])] for side, procs in groups.items()}


def cpu_per_apply(
    vs: dict[str, object], groups: dict[str, dict[str, list]], calls: int, idle: dict[str, list[float]] = None
):
    """ms of CPU per engine per apply (client, controller, engines, total) for
    each view whose system is in ``groups`` ("ours", "stock", "dask"), each
    view measured alone, net of its system's ``idle`` rates if given."""
    rows = {}
    for name, view in vs.items():
        side = "ours" if name.startswith("ours") else "dask" if name == "Dask run" else "stock"
        if side not in groups or not hasattr(view, "apply_sync") or name == "Dask submit":
            continue
        procs = groups[side]
        t_echo(view)
        before, tic = _cpu(procs), time.perf_counter()
        for _ in range(calls):
            t_echo(view)
        after, elapsed = _cpu(procs), time.perf_counter() - tic
        rest = idle.get(side, [0.0] * 3) if idle else [0.0] * 3
        n = len(view)
        per = [1e3 * (a - b - r * elapsed) / calls / n for a, b, r in zip(after, before, rest)]
        rows[name] = dict(
            zip(PARTS, per), total=sum(per), idle=100 * sum(rest[1:]) if idle else None
        )  # % of a core, client aside
    return rows


def cpu_alone(n: int, depth: int, fanout: int, calls: int, with_peers: bool) -> tuple[dict, dict]:
    """The CPU table's rows and each system's idle rates, each system measured
    with only itself up, as a user tries it (ours, the stock cluster, Dask):
    with the others up too, their idle work and memory slowed the one measured,
    unevenly (see ``client-cpu-n16.md``)."""
    rows, idle = {}, {}
    for side in ("stock", "ours") + (("dask",) if with_peers else ()):
        with ExitStack() as stack:
            if side == "dask":
                vs = {}
                add_peers(stack, vs, n)
                groups = {side: dask_groups(vs["Dask run"].client)}
            else:
                rc = _start(stack, (side,), n, depth, fanout)[side]
                vs = views(rc, None) if side == "ours" else views(None, rc)
                groups = {side: process_groups(rc, rc.cluster)}
            for view in vs.values():  # warm: functions cached, buffers grown
                for _ in range(20):
                    t_echo(view)
            idle.update(idle_rates(groups))
            rows.update(cpu_per_apply(vs, groups, calls, idle))
    return rows, idle


def cpu_table(n: int, rows, idle_client: float = None, alone: bool = False) -> str:
    width = max(len(x) for x in rows) + 2
    net = idle_client is not None
    head = f"N={n}: CPU ms per engine per apply (1 kB echo)" + (", net of each system's idle CPU" if net else "")
    cols = PARTS + ("total",) + (("idle %core",) if net else ())
    lines = [head, "view".ljust(width) + "".join(c.rjust(12) for c in cols)]
    for name, r in rows.items():
        cells = [f"{r[c]:12.3f}" for c in PARTS + ("total",)]
        if net:
            cells.append(f"{r['idle']:12.1f}")
        lines.append(name.ljust(width) + "".join(cells))
    if net:
        lines.append(
            f"(idle %core: the system's controller and engines at rest; this process, "
            f"home of every client and of Dask's scheduler, idles at {100 * idle_client:.1f}%)"
        )
    if alone:
        lines.append("(each system measured with only itself up: started, measured, stopped, in turn)")
    return "\n".join(lines)


def add_peers(stack: ExitStack, vs: dict[str, object], n: int):
    """Dask's two ways of reaching every worker, on a local Dask cluster of n workers."""
    cluster, client = peers.dask_cluster(n)
    stack.callback(cluster.close)
    stack.callback(client.close)
    vs["Dask run"] = peers.DaskRun(client)
    vs["Dask submit"] = peers.DaskSubmit(client)


def add_mpi(medians, n: int, reps: int, out: Callable):
    """The MPI job's medians as one more row (measured in its own job, after the others)."""
    if not peers.mpi_available():
        out("(MPI row left out: mpiexec or mpi4py not installed)")
        return
    got = peers.mpi_job(n, reps=reps, many=MANY, echo_bytes=ECHO.nbytes, push_bytes=PUSH.nbytes)
    for m, key in zip(SUITES["calls"], peers.MPI_MEASURES):
        medians[m]["MPI bcast+gather"] = got[key]


def run(
    engine_counts,
    depth: int,
    reps: int,
    fanout: int = 2,
    out: Callable = print,
    suite: str = "calls",
    with_peers: bool = False,
    cpu_calls: int = 0,
):
    results = {}
    for n in engine_counts:
        with ExitStack() as stack:
            ours, stock = start_clusters(stack, n, depth, fanout)
            vs = views(ours, stock, suite)
            if depth == 0 and n == 1:  # its replies break its client (ValueError in _extract_metadata)
                out("(ipyparallel's BroadcastView left out: at depth 0 with one engine it never returns)")
                vs = {k: v for k, v in vs.items() if not k.startswith("ipp ")}
            if with_peers:
                add_peers(stack, vs, n)
            results[n] = medians = measure(vs, reps, suite)
        if cpu_calls:
            rows, idle = cpu_alone(n, depth, fanout, cpu_calls, with_peers)
            out(cpu_table(n, rows, idle_client=idle["ours"][0], alone=True) + "\n")
        if with_peers:
            add_mpi(medians, n, reps, out)
        out(table(n, depth, medians) + "\n")
    return results


def write_report(lines, path=None) -> str:
    """Print a report's lines as one text, and write it to ``path`` if given."""
    text = "\n".join(lines) + "\n"
    print(text)
    if path:
        with open(path, "w") as f:
            f.write(text)
    return text


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--depth", type=int, default=1)
    parser.add_argument("--fanout", type=int, default=2)
    parser.add_argument("--reps", type=int, default=25)
    parser.add_argument("--suite", choices=sorted(SUITES), default="calls")
    parser.add_argument(
        "--cpu",
        type=int,
        default=0,
        metavar="CALLS",
        help="also measure CPU per engine per apply over CALLS echo calls per view",
    )
    parser.add_argument(
        "--peers",
        action="store_true",
        help="add Dask (Client.run, pinned submit) and an MPI bcast+gather job (calls suite)",
    )
    args = parser.parse_args(argv)
    if args.peers and args.suite != "calls":
        parser.error("--peers goes with the calls suite")
    print(__doc__.split("\n\n")[-1])
    run(args.engines, args.depth, args.reps, args.fanout, suite=args.suite, with_peers=args.peers, cpu_calls=args.cpu)


if __name__ == "__main__":
    main()


def chatter():
    """Engine side: print from a thread every millisecond (IOPub under load)."""
    import threading
    import time

    def loop():
        while True:
            print("noise")
            time.sleep(0.001)

    threading.Thread(target=loop, daemon=True).start()
