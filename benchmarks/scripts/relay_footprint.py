"""What a host relay process costs to start: the import time and the memory
(maximum RSS) of a fresh interpreter that imports the host relay's code, and
for comparison what it no longer imports (IPython Parallel, NumPy).

    python benchmarks/scripts/relay_footprint.py --reps 9 --out benchmarks/results/relay-footprint.md

Each figure is the median of ``--reps`` fresh interpreters; a bare interpreter
(``python -c pass``) is the baseline. ``--before REV`` measures the host relay
of an earlier commit too (from a temporary git worktree).

The controller's own relay nodes are forked from it, so they map whatever it
imported (NumPy included) without paying for it: the second table gives, for
a depth-2 cluster's processes forked by the controller, RSS (pages mapped),
PSS (each shared page divided among its sharers) and USS (pages of its own).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import report  # noqa: E402

PROBE = """
import resource, sys, time
t = time.perf_counter()
{imports}
ms = (time.perf_counter() - t) * 1e3
mods = [m for m in ("numpy", "ipyparallel", "IPython", "tornado", "jupyter_client") if m in sys.modules]
print({{"ms": ms, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "loaded": mods}})
"""

CASES = {
    "bare interpreter": "pass",
    "host relay (`relay.hostshell`)": "import ipyparallel_broadcast.relay.hostshell",
    "`import ipyparallel`": "import ipyparallel",
    "`import numpy`": "import numpy",
    "`jupyter_client.session`": "import jupyter_client.session",
    "`tornado.ioloop` (what `jupyter_client.session` loads of tornado)": "import tornado.ioloop",
}


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def measure(imports: str, tree: str = ROOT) -> dict:
    env = dict(os.environ, PYTHONPATH=tree)  # the package of that tree first
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(imports=imports)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=tree,
    ).stdout
    return eval(out.strip().splitlines()[-1])  # a dict literal printed by the probe


def forked_children(engines: int = 4) -> list:
    """(name, rss, pss, uss, maps NumPy) of each process the controller forked."""
    import psutil

    import ipyparallel_broadcast as ipb

    cluster = ipb.Cluster(n=engines, depth=2, fanout=2, log_level=40)
    rc = cluster.start_and_connect_sync()
    try:
        rc.broadcast_view().apply_sync(int)
        me = psutil.Process()
        (controller,) = [p for p in me.children() if "controller" in " ".join(p.cmdline())]
        rows = []
        for p in controller.children():
            mem = p.memory_full_info()
            with open(f"/proc/{p.pid}/maps") as f:
                numpy = "numpy" in f.read()
            rows.append((mem.rss / 2**20, mem.pss / 2**20, mem.uss / 2**20, numpy))
        return rows
    finally:
        rc.close()
        cluster.stop_cluster_sync()


def row(name: str, runs: list) -> str:
    ms, rss = statistics.median(r["ms"] for r in runs), statistics.median(r["rss_mb"] for r in runs)
    return f"| {name} | {ms:.0f} | {rss:.0f} | {', '.join(runs[0]['loaded']) or '-'} |"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--before", help="an earlier commit whose host relay is measured too")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    cases = [(name, imports, ROOT) for name, imports in CASES.items()]
    with tempfile.TemporaryDirectory(prefix="ipb-before-") as tmp:
        if args.before:
            old = os.path.join(tmp, "tree")
            subprocess.run(["git", "worktree", "add", "--detach", old, args.before], cwd=ROOT, check=True)
            sha = subprocess.run(["git", "rev-parse", "--short", args.before], cwd=ROOT, capture_output=True, text=True)
            cases.insert(2, (f"host relay at {sha.stdout.strip()}", CASES["host relay (`relay.hostshell`)"], old))
        try:
            rows = [row(name, [measure(imports, tree) for _ in range(args.reps)]) for name, imports, tree in cases]
        finally:
            if args.before:
                subprocess.run(["git", "worktree", "remove", "--force", old], cwd=ROOT, check=True)
    lines = [
        f"Median of {args.reps} fresh interpreters each. Import: the import statement's wall time; "
        "RSS: the process's maximum resident set after it.",
        "",
        "| process | import (ms) | max RSS (MB) | of these, loaded |",
        "|---|---:|---:|---|",
        *rows,
        "",
        "Python " + sys.version.split()[0] + "; " + json.dumps({"cpus": os.cpu_count()}),
    ]
    forked = forked_children()
    n = len(forked)
    lines += [
        "",
        f"The controller's forked children (7 relay nodes of a depth-2 tree and the queues), {n} processes, MB:",
        "",
        "| per process | RSS | PSS | USS | map NumPy |",
        "|---|---:|---:|---:|---:|",
        f"| median | {statistics.median(r[0] for r in forked):.0f} | {statistics.median(r[1] for r in forked):.1f} "
        f"| {statistics.median(r[2] for r in forked):.1f} | {sum(r[3] for r in forked)} of {n} |",
        f"| all together | {sum(r[0] for r in forked):.0f} | {sum(r[1] for r in forked):.0f} "
        f"| {sum(r[2] for r in forked):.0f} | |",
        "",
        "A forked relay's NumPy pages are the controller's, shared: its own memory (USS) is a few MB.",
        "Started fresh instead, each would hold its own interpreter and imports (the host relay row above).",
    ]
    report("relay_footprint.py", argv, "A host relay process: import time and memory", lines, args.out)


if __name__ == "__main__":
    main()
