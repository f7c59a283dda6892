"""Run one of the package's benchmark tools and keep what it prints as a result file.

    python benchmarks/scripts/record.py --title TITLE --out benchmarks/results/NAME.md \\
        [--json benchmarks/results/NAME.json] -- python -m ipyparallel_broadcast.tools.bench ...

The tools (``bench``, ``farm``, ``compose_bench``) print their tables. This
script runs one, and writes its output under the header every result file
starts with: this very command and the commit it ran at (``report.py``).
With ``--json`` (the path the tool was told to write with its own
``--json``), the JSON file gets the same two facts as its first keys.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import STARTED_AT, command, report  # noqa: E402


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--title", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--json", help="a JSON file the tool writes: command and commit go first in it")
    parser.add_argument("tool", nargs=argparse.REMAINDER, help="-- the tool's command line")
    args = parser.parse_args(argv)
    tool = args.tool[1:] if args.tool[:1] == ["--"] else args.tool
    if not tool:
        parser.error("no tool command after --")
    run = subprocess.run(
        [sys.executable if tool[0] == "python" else tool[0], *tool[1:]], stdout=subprocess.PIPE, text=True
    )
    sys.stderr.write(f"{tool[0]} exited with {run.returncode}\n" if run.returncode else "")
    if run.returncode:
        return run.returncode
    report("record.py", argv, args.title, ["```", run.stdout.strip("\n"), "```"], args.out)
    if args.json:
        with open(args.json) as f:
            data = json.load(f)
        with open(args.json, "w") as f:
            json.dump(dict(command=command("record.py", argv), commit=STARTED_AT, **data), f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
