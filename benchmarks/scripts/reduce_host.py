"""Reduce and allreduce of big arrays on one host: the time, and the host's
memory beyond the engines' own arrays, for each way of doing it.

    python benchmarks/scripts/reduce_host.py --mib 16 --engines 8 --out benchmarks/results/reduce-host-16m-n8.md
    python benchmarks/scripts/reduce_host.py --mib 256 --engines 8 --reps 3 --memory \\
        --out benchmarks/results/reduce-host-256m-n8.md

Every engine holds ``big``, a float64 array of ``--mib`` MiB of its own. Each
way runs alone on the host (its cluster up, the other's down), with the
default tree (depth 1, fan-out 2):

- reduce: the element-wise sum reaches the client: ours ``view.reduce``;
  DirectView's and IPython Parallel's BroadcastView's pull (an apply returning
  the array), summed on the client in engine order;
- allreduce: the sum lands in every engine as ``total``: ours
  ``view.allreduce``; ours by hand (``reduce``, then ``push``); the others'
  pull, sum and push.

Times are medians of ``--reps`` rounds after one warm-up call each; a round
makes every call of the side in turn. With
``--memory``, a thread samples the host's memory during each call (the strict
figure of ``shm_push.host_memory``: every process's PSS less its shared
memory, plus all shared memory); the peak less the figure before the call is
given in multiples of M, one engine's array.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import threading
import time
from contextlib import ExitStack

import ipyparallel as ipp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import report  # noqa: E402
from shm_push import _ipb_cluster, _stock_cluster, host_memory  # noqa: E402


@ipp.interactive
def _value():
    return big  # noqa: F821  (each engine's own array)


@ipp.interactive
def _checksum():
    return float(total[0]) + float(total[-1])  # noqa: F821


def _summed(arrays):
    return functools.reduce(np.add, arrays)


class Peak:
    """The host's memory, sampled on a thread while a call runs: the peak
    above the figure before the call."""

    def __init__(self, on: bool):
        self.on, self.peak = on, None

    def __enter__(self):
        if self.on:
            self.before = self.peak = host_memory()["strict"]
            self.stop = threading.Event()
            self.thread = threading.Thread(target=self._sample, daemon=True)
            self.thread.start()
        return self

    def _sample(self):
        while not self.stop.is_set():
            self.peak = max(self.peak, host_memory()["strict"])

    def __exit__(self, *exc):
        if self.on:
            self.stop.set()
            self.thread.join()
            self.peak = max(self.peak, host_memory()["strict"]) - self.before


def ways(stack: ExitStack, side: str, n: int) -> dict:
    """``{name: (reduce, allreduce)}`` of one side's cluster (functions of no argument)."""
    if side == "ours":
        rc = _ipb_cluster(stack, n, shm=True)
        view = rc.broadcast_view(block=True)

        def by_hand():
            view.push(dict(total=view.reduce(_value, op="sum")))

        return dict(
            view=view,
            calls={
                "ours": (
                    lambda: view.reduce(_value, op="sum"),
                    lambda: view.allreduce(_value, op="sum", name="total"),
                ),
                "ours, reduce then push by hand": (None, by_hand),
            },
        )
    rc = _stock_cluster(stack, n)
    dv = rc[:]
    dv.block = True
    bv = rc.broadcast_view(is_coalescing=True)
    bv.block = True
    calls = {}
    for name, view in (("DirectView", dv), ("ipp BroadcastView", bv)):
        calls[name] = (
            lambda v=view: _summed(v.apply_sync(_value)),
            lambda v=view: v.push(dict(total=_summed(v.apply_sync(_value)))),
        )
    return dict(view=dv, calls=calls)


def run(args) -> dict:
    """``{way: {measure: (seconds, memory in M or None)}}``."""
    out = {}
    for side in args.sides.split(","):
        with ExitStack() as stack:
            made = ways(stack, side, args.engines)
            made["view"].execute(
                f"import numpy as np; big = np.random.default_rng(7).random({args.mib << 17})", block=True
            )
            fns = {
                (name, measure): fn
                for name, pair in made["calls"].items()
                for measure, fn in zip(("reduce", "allreduce"), pair)
                if fn is not None
            }
            for fn in fns.values():
                fn()  # warm-up (imports, connections, warm buffers)
            times = {key: [] for key in fns}
            peaks = {key: [] for key in fns}
            for _ in range(args.reps):  # interleaved: drift hits every way alike
                for key, fn in fns.items():
                    with Peak(args.memory) as peak:
                        tic = time.perf_counter()
                        fn()
                        times[key].append(time.perf_counter() - tic)
                    peaks[key].append(peak.peak)
            sums = made["view"].apply_sync(_checksum)  # the sum is in every engine
            assert len(set(sums)) == 1, sums
            for (name, measure), ts in times.items():
                mem = max(peaks[name, measure]) / (args.mib << 20) if args.memory else None
                out.setdefault(name, {})[measure] = (statistics.median(ts), mem, min(ts), max(ts))
                print(name, measure, out[name][measure], [round(t, 3) for t in ts], file=sys.stderr)
    return out


def table(args, out) -> list[str]:
    base = out.get("DirectView", {})
    lines = [
        f"{args.engines} engines on one host (2 cores), {args.mib} MiB of float64 each; "
        f"median of {args.reps} rounds (fastest and slowest in brackets); ratios of medians against DirectView's."
        + (" Memory sampled during every call (the sampling slows the calls)." if args.memory else ""),
        "",
        "| way | reduce (s) | × DirectView | allreduce (s) | × DirectView |"
        + (" reduce: memory beyond the arrays (× M) | allreduce: same (× M) |" if args.memory else ""),
        "|---|---:|---:|---:|---:|" + ("---:|---:|" if args.memory else ""),
    ]
    for name, measures in out.items():
        cells = []
        for measure in ("reduce", "allreduce"):
            if measure in measures:
                t, _, fastest, slowest = measures[measure]
                ratio = f"{t / base[measure][0]:.2f}" if measure in base else "-"
                cells += [f"{t:.3f} ({fastest:.3f}-{slowest:.3f})", ratio]
            else:
                cells += ["-", "-"]
        if args.memory:
            cells += [f"{measures[m][1]:.2f}" if m in measures else "-" for m in ("reduce", "allreduce")]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=16)
    parser.add_argument("--engines", type=int, default=8)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--memory", action="store_true", help="sample the host's memory during each call")
    parser.add_argument("--sides", default="ours,stock", help="ours, stock (IPython Parallel's views), or both")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    out = run(args)
    report(
        "reduce_host.py",
        argv,
        f"Reduce and allreduce of {args.mib} MiB per engine, {args.engines} engines on one host",
        table(args, out),
        args.out,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
