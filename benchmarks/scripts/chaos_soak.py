"""The chaos soak, long: its report and a plot.

    python benchmarks/scripts/chaos_soak.py --hosts 4 --engines 4 --sim-hosts 16 \\
        --sim-engines 64 --clients 3 --seconds 600 --out FILE.md [--json FILE.json] [--plot PNG]

Runs ``ipyparallel_broadcast.tools.chaos.soak`` (see there: the bed, the
workload, the nemesis, the checker) and writes what it found: the faults
injected by kind, the calls made and how they ended by operation, the
checker's counts (hung, lost, misdelivered, run twice), the errors by cause,
and whether every operation works afterwards. The plot shows calls ended per
10 s (succeeded, or with some engines failed) and when each kind of fault struck.
Needs root.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import command, commit, report  # noqa: E402

from ipyparallel_broadcast.tools.chaos.nemesis import FAULTS  # noqa: E402
from ipyparallel_broadcast.tools.chaos.soak import soak, soak_options  # noqa: E402


def tables(result, args) -> list:
    v = result["verdict"]
    faults = collections.Counter(kind for _, kind, detail in result["faults"] if not detail.startswith("skipped"))
    skipped = sum(detail.startswith("skipped") for _, _, detail in result["faults"])
    lines = [
        f"Bed: {args.hosts} hosts x {args.engines} real engines (network namespaces, links at 200 Mbit/s), "
        f"{args.sim_hosts} simulated hosts x {args.sim_engines} engines: {result['engines']} engines; "
        f"{args.clients} clients for {args.seconds:g} s; faults at {args.rate:g}/s; "
        f"every call must end within {args.bound:g} s.",
        "",
        "## Faults injected",
        "",
        "| fault | times |",
        "|---|---|",
    ]
    lines += [f"| {kind} | {faults[kind]} |" for kind in FAULTS if faults[kind]]
    lines += [
        f"| **all** | **{sum(faults.values())}** ({skipped} more found no target) |",
        "",
        "## Calls",
        "",
        "| operation | ended ok | ended, some engines failed | hung | refused at send |",
        "|---|---|---|---|---|",
    ]
    for op, c in sorted(v.by_op.items()):
        lines.append(f"| {op} | {c['ok']} | {c['failed']} | {c['hung']} | {c['refused']} |")
    s = v.summary()
    lines += [
        "",
        "## Checker",
        "",
        "| what | count |",
        "|---|---|",
        f"| calls made | {s['calls']} |",
        f"| executions logged on engines | {s['executions']} |",
        f"| hung (not ended within the bound) | {s['hung']} |",
        f"| lost (a target with no outcome) | {s['lost']} |",
        f"| errors not naming their engine | {s['unnamed']} |",
        f"| results of another call or client | {s['wrong']} |",
        f"| executed twice on one engine | {s['twice']} |",
        f"| outputs named missing | {s['output_missing']} |",
        "",
        "## Engine errors by cause",
        "",
        "| cause | engine outcomes |",
        "|---|---|",
    ]
    lines += [f"| {cause} | {n} |" for cause, n in v.errors_by_cause.most_common()]
    bad = {k: x for k, x in result["after"].items() if x != "ok"}
    lines += [
        "",
        "## Afterwards",
        "",
        "Every killed engine and simulated host replaced and registered, the dead unregistered: "
        + ("yes." if result.get("settled") == "ok" else f"no ({result.get('settled')})."),
        "",
        f"Every operation in every reply mode on all {result['engines']} engines from a new client: "
        + ("all ok." if not bad else f"{len(bad)} failed: {bad}"),
    ]
    for h in v.hung:
        lines.append(f"- hung: {h}")
    if v.wrong:
        lines += [
            "",
            "## Results not the call's own",
            "",
            "(client, call, operation, mode, targets, engine, what came)",
            "",
        ]
        lines += [f"- {w}" for w in v.wrong]
    return lines


def plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start, step = result["started"], 10
    ok, failed = collections.Counter(), collections.Counter()
    for r in result["records"]:
        if r.get("ended") is None:
            continue
        bucket = int((r["ended"] - start) // step)
        (failed if any(o[0] == "error" for o in r["outcomes"].values()) else ok)[bucket] += 1
    n = max(list(ok) + list(failed) + [0]) + 1
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5), sharex=True, height_ratios=[3, 2])
    xs = [i * step for i in range(n)]
    top.bar(xs, [ok[i] for i in range(n)], width=step * 0.9, align="edge", label="ended ok")
    top.bar(
        xs,
        [failed[i] for i in range(n)],
        width=step * 0.9,
        align="edge",
        bottom=[ok[i] for i in range(n)],
        label="ended, some engines failed (named)",
    )
    top.set_ylabel(f"calls ended per {step} s")
    top.legend(loc="upper right", fontsize=8)
    kinds = [k for k in FAULTS if any(f == k for _, f, _ in result["faults"])]
    for t, kind, detail in result["faults"]:
        if not detail.startswith("skipped"):
            bottom.plot(t - start, kinds.index(kind), "|", markersize=10, color="C3")
    bottom.set_yticks(range(len(kinds)), kinds, fontsize=7)
    bottom.set_xlabel("seconds")
    fig.suptitle(
        f"Chaos soak: {result['engines']} engines, {len(result['faults'])} faults, "
        f"{result['verdict'].calls} calls, {len(result['verdict'].hung)} hung"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    soak_options(ap, hosts=4, engines=4, sim_hosts=16, sim_engines=64, seconds=600)
    ap.add_argument("--out")
    ap.add_argument("--json")
    ap.add_argument("--plot")
    args = ap.parse_args(argv)
    result = soak(args, progress=lambda line: print(line, flush=True))
    report("chaos_soak.py", argv, "Chaos soak", tables(result, args), args.out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                dict(
                    command=command("chaos_soak.py", argv),
                    commit=commit(),
                    summary=result["verdict"].summary(),
                    faults=result["faults"],
                    after=result["after"],
                    hung=result["verdict"].hung,
                    wrong=result["verdict"].wrong,
                    by_op={k: dict(c) for k, c in result["verdict"].by_op.items()},
                ),
                f,
                indent=1,
            )
    if args.plot:
        plot(result, args.plot)
    return 0 if result["verdict"].clean else 1


if __name__ == "__main__":
    sys.exit(main())
