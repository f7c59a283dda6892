"""A client on the NetBed's controller host, driven from the benchmark's
process one step at a time (``bigpush_bed.py``, ``reduce_bed.py``)."""

from __future__ import annotations

import json
import subprocess
import sys


class Driver:
    """``program`` (Python source) run in the controller's namespace with
    ``args``: it prints its views' names as a JSON list, then answers each
    JSON line it reads with one JSON line."""

    def __init__(self, bed, program: str, args):
        self.proc = bed.popen(
            bed.controller,
            [sys.executable, "-c", program, *map(str, args)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.views = json.loads(self.proc.stdout.readline())

    def __call__(self, name, what, size=0):
        self.proc.stdin.write(json.dumps([name, what, size]) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the client driver exited during {what} on {name}")
        return json.loads(line)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=120)
