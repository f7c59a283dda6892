"""Coverage-guided fuzzing of every boundary (``tools/fuzz/targets.py``), long
runs: each target under atheris for ``--runs`` inputs, from its seeds and the
corpus kept in the repository, which it leaves minimized and grown.

    python benchmarks/scripts/fuzz.py --runs 1000000 --out benchmarks/results/fuzz.md

Per target: inputs run, seconds, inputs per second, coverage reached (libFuzzer's
``cov``: edges; ``ft``: features), the corpus kept, and findings: an input that
crashed a target (an exception it must not raise, or a ``Finding``) is kept in
``tests/fuzz_corpus/<target>/`` as a regression input, which the suite replays
(``tests/test_fuzz_targets.py``). Needs ``atheris`` (in the ``bench`` extras).
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import report  # noqa: E402

from ipyparallel_broadcast.tools.fuzz import targets as T  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STATS = re.compile(r"#(\d+)\s+(?:DONE|pulse|NEW|REDUCE|INITED)\s+cov: (\d+) ft: (\d+) corp: (\d+)")


def merge(runner: list, merged: str, work: str):
    """The corpus minimized into ``merged``; once more with no memory limit and a
    long timeout if libFuzzer's merge fails (its inner runs are one process)."""
    for extra in ([], ["-rss_limit_mb=0", "-timeout=600"]):
        run = subprocess.run(runner + ["-merge=1", *extra, merged, work], capture_output=True, text=True)
        if run.returncode == 0:
            return
        print(f"merge failed ({run.returncode}):\n{run.stderr[-2000:]}", file=sys.stderr, flush=True)
    raise RuntimeError(f"the corpus could not be merged ({run.returncode}): {run.stderr[-600:]}")


def fuzz(name: str, runs: int, kept: str, max_len: int) -> dict:
    """One target's run; its corpus in ``kept`` replaced by the merged one."""
    runner = [sys.executable, "-m", "ipyparallel_broadcast.tools.fuzz", name]
    with tempfile.TemporaryDirectory(prefix=f"ipb-fuzz-{name}-") as tmp:
        work, merged, found = (os.path.join(tmp, d) for d in ("work", "merged", "found"))
        for d in (work, merged, found):
            os.makedirs(d)
        for i, seed in enumerate(T.seeds()[name]):
            with open(os.path.join(work, f"seed-{i}"), "wb") as f:
                f.write(seed)
        for path in glob.glob(os.path.join(kept, "*")):
            shutil.copy(path, work)
        start = time.monotonic()
        run = subprocess.run(
            runner + [f"-runs={runs}", f"-max_len={max_len}", f"-artifact_prefix={found}/", "-timeout=10", work],
            capture_output=True,
            text=True,
        )
        seconds = time.monotonic() - start
        stats = STATS.findall(run.stderr)
        done, cov, ft, _ = (int(x) for x in stats[-1]) if stats else (0, 0, 0, 0)
        artifacts = sorted(os.listdir(found))
        if run.returncode and not artifacts:
            raise RuntimeError(f"{name}: the fuzzer failed without an artifact:\n{run.stderr[-3000:]}")
        merge(runner, merged, work)
        os.makedirs(kept, exist_ok=True)
        regressions = [p for p in glob.glob(os.path.join(kept, "*")) if os.path.basename(p).startswith("found-")]
        for path in glob.glob(os.path.join(kept, "*")):
            if path not in regressions:
                os.unlink(path)
        for path in glob.glob(os.path.join(merged, "*")):
            shutil.copy(path, kept)
        for artifact in artifacts:  # what it found: kept for the suite to replay
            shutil.copy(os.path.join(found, artifact), os.path.join(kept, f"found-{artifact}"))
        crash = re.search(r"(Traceback.*?)(?:==\d+==|$)", run.stderr, re.S)
        return dict(
            name=name,
            runs=done,
            seconds=seconds,
            cov=cov,
            ft=ft,
            corpus=len(os.listdir(merged)),
            findings=artifacts,
            crash=crash.group(1).strip().splitlines()[-1] if crash and artifacts else "",
        )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1_000_000, help="inputs per target")
    parser.add_argument("--targets", default=",".join(T.TARGETS))
    parser.add_argument("--corpus", default=os.path.join(ROOT, "tests", "fuzz_corpus"))
    parser.add_argument("--max-len", type=int, default=4096, help="bytes per input, at most")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    rows = []
    for name in args.targets.split(","):
        rows.append(fuzz(name, args.runs, os.path.join(args.corpus, name), args.max_len))
        print({k: v for k, v in rows[-1].items()}, file=sys.stderr, flush=True)  # progress, per target
    lines = [
        "| target | inputs | seconds | inputs/s | edges (cov) | features (ft) | corpus kept | findings |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        found = f"{len(r['findings'])}: {r['crash']}" if r["findings"] else "0"
        lines.append(
            f"| `{r['name']}` | {r['runs']:,} | {r['seconds']:.0f} | {r['runs'] / max(r['seconds'], 1e-9):,.0f} "
            f"| {r['cov']} | {r['ft']} | {r['corpus']} | {found} |"
        )
    lines += [
        "",
        "A finding is an input on which a target raised what it must not, or did what it must not",
        "(loaded a class, ran code); it stops that target's run, and is kept under",
        "`tests/fuzz_corpus/<target>/found-*` for the suite to replay once fixed.",
    ]
    report("fuzz.py", argv, f"Fuzzing every boundary, {args.runs:,} inputs per target", lines, args.out)
    return 1 if any(r["findings"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
