"""Many short chaos soaks, one per seed: does any call hang, on any view?

    python benchmarks/scripts/chaos_runs.py --runs 10 --seconds 60 --out FILE.md

Each run is ``ipyparallel_broadcast.tools.chaos.soak`` on a fresh bed (its
options as there), its clients spread over every view (a BroadcastView on
the ``tree``, ``direct`` and ``auto`` paths, DirectView, LoadBalancedView) and
its nemesis over every fault, the controller's queues included. Per run:
the faults, and how calls ended per view; then the totals. Needs root.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import report  # noqa: E402

from ipyparallel_broadcast.tools.chaos.soak import soak, soak_options  # noqa: E402
from ipyparallel_broadcast.tools.chaos.workload import VIEWS  # noqa: E402


def cell(c: collections.Counter) -> str:
    return f"{c['ok']} / {c['failed']} / **{c['hung']}**"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    soak_options(ap)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    rows, totals, faults_all = [], collections.defaultdict(collections.Counter), collections.Counter()
    details = []  # what each call that hung waited for, and what did not work afterwards
    clean_runs, first_seed = 0, args.seed
    for i in range(args.runs):
        args.seed = first_seed + i
        tic = time.monotonic()
        result = soak(args, progress=lambda line: None)
        v, s = result["verdict"], result["verdict"].summary()
        faults = collections.Counter(k for _, k, d in result["faults"] if not d.startswith("skipped"))
        faults_all.update(faults)
        for view, c in v.by_view.items():
            totals[view].update(c)
        bad_after = {k: x for k, x in result["after"].items() if x != "ok"}
        clean = v.clean and not result["stuck_clients"] and not result["failed_clients"] and not bad_after
        clean = clean and result["settled"] == "ok"
        clean_runs += clean
        rows.append(
            f"| {args.seed} | {sum(faults.values())} | {faults['kill_queue']} | {s['calls']} | "
            + " | ".join(cell(v.by_view.get(view, collections.Counter())) for view in VIEWS)
            + f" | {s['lost']} / {s['unnamed']} / {s['wrong']} / {s['twice']}"
            + f" | {'all ok' if not bad_after else len(bad_after)} | {time.monotonic() - tic:.0f} |"
        )
        print(rows[-1], flush=True)
        details += [f"- seed {args.seed}, hung: {h}" for h in v.hung]
        for what in ("lost", "unnamed", "wrong", "twice"):  # (client, seq, op, ...) each
            details += [f"- seed {args.seed}, {what}: {item}" for item in getattr(v, what)]
        details += [f"- seed {args.seed}, afterwards: {k}: {x}" for k, x in bad_after.items()]
        details += [f"- seed {args.seed}, a client process never ended" for _ in result["stuck_clients"]]
        details += [f"- seed {args.seed}, a client process failed (it could not run)" for _ in result["failed_clients"]]
        if result["settled"] != "ok":
            details.append(f"- seed {args.seed}, the bed did not settle: {result['settled']}")
    lines = [
        f"Bed: {args.hosts} hosts x {args.engines} real engines (network namespaces, links at 200 Mbit/s), "
        f"{args.sim_hosts} simulated hosts x {args.sim_engines} engines; {args.clients} clients for "
        f"{args.seconds:g} s per run; faults at {args.rate:g}/s; every call must end within {args.bound:g} s; "
        f"a big reduce's way between hosts: {args.reduce_shape}; a big push's: {args.push_shape}. "
        "A BroadcastView on the `direct` path, DirectView and LoadBalancedView reach real engines only.",
        "",
        f"Runs with no call hung, lost, unnamed, misdelivered or run twice, every client running, the bed "
        f"settled (every engine registered again) and every operation working afterwards: "
        f"**{clean_runs} of {args.runs}**.",
        "",
        "Calls per view: ended ok / ended with some engines failed (named) / **hung**.",
        "",
        "| seed | faults | of them `kill_queue` | calls | "
        + " | ".join(f"`{v}`" for v in VIEWS)
        + " | lost / unnamed / wrong / twice | afterwards | seconds |",
        "|---:|---:|---:|---:|" + "---|" * len(VIEWS) + "---|---|---:|",
        *rows,
        "| **all** | **{}** | **{}** | **{}** | {} | | | |".format(
            sum(faults_all.values()),
            faults_all["kill_queue"],
            sum(sum(c[k] for k in ("ok", "failed", "hung")) for c in totals.values()),
            " | ".join(cell(totals[view]) for view in VIEWS),
        ),
        "",
        "## Faults, all runs",
        "",
        "| fault | times |",
        "|---|---:|",
        *[f"| {k} | {n} |" for k, n in faults_all.most_common()],
    ]
    if details:
        lines += ["", "## What went wrong", "", *details]
    report("chaos_runs.py", argv, f"Chaos soaks, {args.runs} runs of {args.seconds:g} s, every view", lines, args.out)
    return 0 if clean_runs == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
