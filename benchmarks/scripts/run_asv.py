"""Run the asv suites on this machine's profile, then stop the pooled clusters.

    python benchmarks/scripts/run_asv.py --profile local [--quick] [--bench REGEX] [--publish]

Uses the current Python environment (``asv run --python=same``) and records
the results under this commit. ``--check`` fails if any benchmark has no result.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def asv(*args, env=None):
    cmd = [sys.executable, "-m", "asv", *args]
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=ROOT, env=env).returncode


def missing_results(commit: str, expected=()) -> list:
    """What this commit's results lack: every benchmark if no result file
    exists, else those of ``expected`` with no entry and those with no value."""
    paths = glob.glob(os.path.join(ROOT, "benchmarks", "asv-results", "*", f"{commit[:8]}*.json"))
    if not paths:
        return [f"(no result file for commit {commit[:8]})"]
    missing, seen = [], set()
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        columns = data.get("result_columns", [])
        for name, row in data.get("results", {}).items():
            seen.add(name)
            values = dict(zip(columns, row)).get("result")
            if not values or all(v is None for v in values):
                missing.append(name)
    return missing + sorted(set(expected) - seen)


def benchmark_names(regexes) -> list:
    """The benchmarks asv discovered (``benchmarks.json``) that ``regexes`` select."""
    with open(os.path.join(ROOT, "benchmarks", "asv-results", "benchmarks.json")) as f:
        names = [n for n in json.load(f) if n != "version"]
    return [n for n in names if not regexes or any(re.search(r, n) for r in regexes)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default=os.environ.get("IPB_BENCH_PROFILE", "local"))
    parser.add_argument("--quick", action="store_true", help="one sample per benchmark (asv --quick)")
    parser.add_argument("--bench", "-b", action="append", default=[], help="asv -b regex")
    parser.add_argument("--machine", default=None, help="asv machine name (default: this host's)")
    parser.add_argument("--publish", action="store_true", help="asv publish the HTML site afterwards")
    parser.add_argument("--check", action="store_true", help="fail if a benchmark has no result")
    args = parser.parse_args(argv)

    env = dict(os.environ, IPB_BENCH_PROFILE=args.profile)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    commit = subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=ROOT, text=True).strip()
    machine = ["--machine", args.machine] if args.machine else []
    asv("machine", "--yes", *machine, env=env)
    run = ["run", "--python=same", f"--set-commit-hash={commit}", "--show-stderr", *machine]
    run += ["--quick"] if args.quick else []
    for regex in args.bench:
        run += ["-b", regex]
    sys.path.insert(0, ROOT)
    from benchmarks import pool

    try:
        code = asv(*run, env=env)
    finally:
        pool.stop_all()
    if args.publish:
        code = asv("publish", env=env) or code
    if args.check:
        missing = missing_results(commit, benchmark_names(args.bench))
        if missing:
            print("benchmarks without a result:", *missing, sep="\n  ")
            code = code or 1
    return code


if __name__ == "__main__":
    sys.exit(main())
