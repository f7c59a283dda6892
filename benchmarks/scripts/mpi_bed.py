"""MPICH's collectives on the NetBed, through mpi4py, for the reduce table's MPI rows.

    python benchmarks/scripts/mpi_bed.py --hosts 8 --per-host 4,1 --rate 200mbit --mib 16 \\
        --out benchmarks/results/mpi-bed-8x4-200mbit.md

The same bed as ``reduce_bed.py``: a controller host and ``--hosts`` engine
hosts, each a network namespace, every link capped with ``tc tbf`` both ways.
Rank 0 runs alone on the controller host (where our client is), ``--per-host``
ranks on each engine host; each rank holds a float64 array of M bytes.
Hydra starts one proxy per host through a launcher script that enters the
host's network namespace and a UTS namespace of its own named for the host
(so MPICH sees one node per host); ``UCX_TLS=tcp,self`` keeps every byte
between hosts on the capped links. Each rank checks the layout first (its
namespace, and the size of its node's ``COMM_TYPE_SHARED`` communicator).

Timed, each a median of ``--reps`` after one warm-up, as the slowest rank saw
it (a barrier before; the time to the operation's end on every rank):
``Reduce`` to rank 0 (``IN_PLACE`` at the root: without it this MPICH dropped
the root's own contribution), ``Allreduce``, ``Bcast`` from rank 0 and
``Gather`` of ``--gather-mib`` MiB in all to rank 0. MPICH's ranks spin while
they wait: the table gives each run's CPU load (processes' CPU seconds over
wall seconds, on the bed's 2 cores), to say whether a run was CPU-bound.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import report  # noqa: E402

from ipyparallel_broadcast.tools.mpibed import Hydra, mpiexec  # noqa: E402
from ipyparallel_broadcast.tools.netbed import NetBed, _rate_bits  # noqa: E402

FINALIZE_GRACE = 30  # seconds an MPI job may take to end after its result

PROGRAM = textwrap.dedent("""
    import json, os, statistics, sys, time
    import numpy as np
    from mpi4py import MPI

    mib, gather_mib, reps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    layout = comm.gather((os.stat("/proc/self/ns/net").st_ino, os.uname().nodename, node.Get_size()), root=0)
    n = (mib << 20) // 8
    mine = np.full(n, rank + 1.0)
    out = np.empty(n)
    part = np.full(max(1, (gather_mib << 20) // 8 // size), float(rank))
    parts = np.empty(part.size * size) if rank == 0 else None

    def reduce():
        if rank == 0:
            out[:] = mine
            comm.Reduce(MPI.IN_PLACE, out, op=MPI.SUM, root=0)
        else:
            comm.Reduce(mine, None, op=MPI.SUM, root=0)

    def allreduce():
        comm.Allreduce(mine, out, op=MPI.SUM)

    def bcast():
        comm.Bcast(mine if rank == 0 else out, root=0)

    def gather():
        comm.Gather(part, parts, root=0)

    times, right = {}, {}
    total = size * (size + 1) / 2
    for name, op in (("Reduce", reduce), ("Allreduce", allreduce), ("Bcast", bcast), ("Gather", gather)):
        samples = []
        for i in range(reps + 1):
            comm.Barrier()
            tic = time.perf_counter()
            op()
            took = comm.allreduce(time.perf_counter() - tic, op=MPI.MAX)
            if i:
                samples.append(took)
        times[name] = samples
        if name in ("Reduce", "Allreduce"):  # the sum is right where it should be
            right[name] = comm.allreduce(bool(rank != 0 and name == "Reduce" or np.all(out == total)), op=MPI.LAND)
    if rank == 0:
        print(json.dumps(dict(layout=layout, times=times, right=right)), flush=True)
    MPI.Finalize()
""")


def run(args, per_host: int) -> dict:
    with NetBed(hosts=args.hosts) as bed, tempfile.TemporaryDirectory(prefix="ipb-mpi-") as tmp:
        for host in [bed.controller] + bed.hosts:
            bed.limit(host, args.rate)
        hosts = [bed.controller] + bed.hosts
        hydra = Hydra(bed, tmp)
        program = os.path.join(tmp, "program.py")
        with open(program, "w") as f:
            f.write(PROGRAM)
        n = 1 + per_host * len(bed.hosts)
        placed = hydra.args([(bed.controller, 1)] + [(h, per_host) for h in bed.hosts])
        argv = [
            mpiexec(), *placed, "-n", str(n),
            sys.executable, program, str(args.mib), str(args.gather_mib), str(args.reps),
        ]  # fmt: skip
        cpu0 = _cpu_seconds()
        import time

        tic = time.perf_counter()
        done = bed.popen(bed.controller, argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = _result_line(done, args.timeout)
        wall, cpu = time.perf_counter() - tic, _cpu_seconds() - cpu0
        if line is None:
            raise RuntimeError(f"the MPI job gave no result ({done.returncode}); run it by hand to see why")
        result = json.loads(line)
        nodes = {(ino, name) for ino, name, _ in result["layout"]}
        sizes = sorted({s for *_, s in result["layout"]})
        if len(nodes) != len(hosts):
            raise RuntimeError(f"ranks on {len(nodes)} hosts, not {len(hosts)}: {result['layout']}")
        if not all(result["right"].values()):
            raise RuntimeError(f"MPI gave a wrong sum: {result['right']}")
        result.update(ranks=n, per_host=per_host, load=cpu / wall, node_sizes=sizes)
        return result


def _result_line(job: subprocess.Popen, timeout: float) -> str | None:
    """Rank 0's JSON line, once it comes; the job is then given ``FINALIZE_GRACE``
    seconds to end, and stopped (``MPI_Finalize`` has hung here after every
    result was in). None if the job ended, or ``timeout`` passed, without it."""
    import selectors
    import signal
    import time

    deadline, line = time.monotonic() + timeout, None
    with selectors.DefaultSelector() as sel:
        sel.register(job.stdout, selectors.EVENT_READ)
        while line is None and time.monotonic() < deadline:
            if not sel.select(timeout=1.0):
                if job.poll() is not None:
                    break
                continue
            text = job.stdout.readline()
            if not text:
                break
            if text.startswith("{"):
                line = text
    try:
        job.wait(timeout=FINALIZE_GRACE if line is not None else 1)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    return line


def _cpu_seconds() -> float:
    """CPU seconds of this process's finished children and the machine's other work: the
    machine's busy time from /proc/stat (every process on the bed shares it)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields) - idle) / os.sysconf("SC_CLK_TCK")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--per-host", default="4,1", help="ranks per engine host, comma-separated: one run each")
    parser.add_argument("--rate", default="200mbit")
    parser.add_argument("--mib", type=int, default=16, help="each rank's array (Reduce, Allreduce, Bcast)")
    parser.add_argument("--gather-mib", type=int, default=16, help="Gather: MiB in all at rank 0")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=1200)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    why = NetBed.available()
    if why:
        parser.error(why)
    if shutil.which("mpiexec") is None:
        parser.error("MPICH is not installed (apt-get install mpich libmpich-dev)")
    floor = (args.mib << 20) / (_rate_bits(args.rate) / 8)
    gather_floor = (args.gather_mib << 20) / (_rate_bits(args.rate) / 8)
    lines = [
        f"NetBed: rank 0 alone on the controller host, {args.hosts} engine hosts, every link capped at "
        f"{args.rate} each way (tbf); MPICH through mpi4py, UCX over TCP only. Each rank holds a float64 "
        f"array of M = {args.mib} MiB (Gather: {args.gather_mib} MiB in all). Medians of {args.reps}, "
        "as the slowest rank saw them. Floor: M/B over one link (Gather: the total over rank 0's link).",
        "Load: the machine's busy CPU seconds over the run's wall seconds (2 cores: 2.0 is all of them).",
        "",
        "| ranks per host | ranks | operation | time (s) | each (s) | x floor | load |",
        "|---:|---:|---|---:|---|---:|---:|",
    ]
    import statistics

    layouts = []
    for per_host in (int(p) for p in args.per_host.split(",")):
        result = run(args, per_host)
        print(json.dumps(result), file=sys.stderr)
        layouts.append(
            f"{per_host} per host: {result['ranks']} ranks on {args.hosts + 1} hosts (one network namespace "
            f"and node name each); ranks per node as MPICH saw them: {result['node_sizes']}."
        )
        for name, samples in result["times"].items():
            t = statistics.median(samples)
            f = gather_floor if name == "Gather" else floor
            lines.append(
                f"| {per_host} | {result['ranks']} | {name} | {t:.2f} | {' '.join(f'{s:.2f}' for s in samples)} | "
                f"{t / f:.1f} | {result['load']:.2f} |"
            )
    lines += ["", *layouts]
    report("mpi_bed.py", argv, f"MPICH's collectives across {args.hosts} hosts at {args.rate}", lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
