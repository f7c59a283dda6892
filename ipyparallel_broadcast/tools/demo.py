"""The main job: a local cluster, broadcasts in both reply modes, collectives,
and a comparison with DirectView and ipyparallel's own BroadcastView, measured
in the same run. ``python -m ipyparallel_broadcast.tools.demo [--engines 8 --depth 2]``

The tree is the default one ('auto': picked for the engines and this host's
cores) unless ``--depth`` (and ``--fanout``) say otherwise; the stock
cluster's broadcast scheduler gets the same depth, 1 at least (``bench.stock_depth``).
"""

import argparse
import os
from contextlib import ExitStack

import ipyparallel as ipp
import numpy as np

from ..client.view import Batch
from ..engine.compose.host import cpu_count
from ..wire.topology import auto_shape
from . import bench


def show_broadcasts(rc):
    print(rc.broadcast_tree(), "\n")
    for coalescing in (True, False):
        mode = "coalescing" if coalescing else "streaming"
        view = rc.broadcast_view(coalescing=coalescing)
        print(f"--- {view!r}")
        ar = view.apply_async(np.linalg.norm, np.ones(1000))
        print(f"apply(np.linalg.norm, ones(1000)) -> {[round(float(x), 3) for x in ar.get()]}")
        print(f"  one message out, replies from engines {ar.engine_id}")
        ar = view.execute("import os; print('hello from pid', os.getpid())", block=True)
        print(f"execute(print) -> stdout of engine 0: {ar.stdout[0].strip()!r}")
        view.push({"rank_offset": 100}, block=True)
        view.execute("r = rank_offset + get_ipython().kernel.engine_id", block=True)
        print(f"push + execute + pull -> {view.pull('r', block=True)}")
        errors = view.apply_async(lambda: 1 / 0).get(return_exceptions=True)
        print(f"remote errors come back per engine ({mode}): {errors[0]!r}\n")


def show_collectives(rc):
    view = rc.broadcast_view(coalescing=Batch(count=2), block=True)
    print(f"--- collectives, one client message each, {view!r}")
    data = np.arange(len(rc) * 4.0)
    view.scatter("part", data)
    print(f"scatter(arange({data.size})) -> engine 0 has {rc[0]['part']}")
    print(f"gather -> {view.gather('part')}")
    print(f"map(x + 1, range(10)) -> {view.map(bench.cheap, range(10))}")
    total = view.reduce(ipp.interactive(lambda: part.sum()), op="sum")  # noqa: F821
    print(f"reduce(part.sum(), op='sum'), combined in the tree -> {total} (= {data.sum()})")
    view.allreduce(ipp.interactive(lambda: part), op="max", name="peak")  # noqa: F821
    print(f"allreduce(part, op='max', name='peak'): in every engine, not via the client -> {rc[0]['peak']}\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, default=8)
    parser.add_argument("--depth", type=int, help="tree depth (default: the controller's 'auto')")
    parser.add_argument("--fanout", type=int, help="tree fan-out (default: the controller's 'auto')")
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args(argv)
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    # what the controller's 'auto' picks on this host, decided here so the stock cluster gets the same depth
    shape = auto_shape(args.engines, cpu_count(), args.depth, args.fanout)
    with ExitStack() as stack:
        print(
            f"Starting two local clusters of {args.engines} engines each: ours (relay tree depth "
            f"{shape.depth}, fan-out {shape.fanout}) and stock ipyparallel (broadcast scheduler depth "
            f"{bench.stock_depth(shape.depth)})..."
        )
        ours, stock = bench.start_clusters(stack, args.engines, shape.depth, shape.fanout)
        show_broadcasts(ours)
        show_collectives(ours)
        print(f"Timing, {args.reps} interleaved rounds (medians):\n")
        medians = bench.measure(bench.views(ours, stock), args.reps)
        print(bench.table(args.engines, shape.depth, medians) + "\n")
        suite = "collectives"
        medians = bench.measure(bench.views(ours, stock, suite), max(args.reps // 3, 3), suite)
        print(bench.table(args.engines, shape.depth, medians))
        print("\nShutting the clusters down.")
    print("Done.")


if __name__ == "__main__":
    main()
