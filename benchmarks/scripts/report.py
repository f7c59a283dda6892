"""The head of every file under ``benchmarks/results/``: the command and the
commit that made it (a run with uncommitted changes says so)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def commit() -> str:
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no", "--", ":(top,exclude)benchmarks/results"],
        cwd=HERE,
        capture_output=True,
        text=True,
    ).stdout.strip()  # results are outputs
    return sha + (" (with uncommitted changes)" if dirty else "")


def command(script: str, argv=None) -> str:
    args = shlex.join(argv if argv is not None else sys.argv[1:])
    return f"python benchmarks/scripts/{script} {args}".rstrip()


STARTED_AT = commit()  # the code that runs is the code at the start, whatever changes meanwhile


def report(script: str, argv, title: str, lines, out=None) -> str:
    """Print a result file's text, headed by its title, command and commit
    (as when the script started); write it to ``out`` too."""
    text = (
        "\n".join([f"# {title}", "", f"Command: `{command(script, argv)}`", f"Commit: {STARTED_AT}", "", *lines]) + "\n"
    )
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text)
    return text
