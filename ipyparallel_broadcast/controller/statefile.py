"""The hub's engine journal, synced to disk once per burst of changes.

IPython Parallel's hub rewrites its whole engine-state file (every engine's
id and uuid: what ``ipcontroller --restore`` reads) on each registration and
unregistration: O(N) per engine, O(N²) for N engines (4,096 simulated engines:
coalescing those writes took the hub's CPU while they registered from 41 s to
14 s: ``benchmarks/results/registration-1024-4096*.md``). Ours appends a
line per change (``enginejournal``) and syncs the file here: the first change
of a burst schedules one sync ``DELAY`` seconds later, and the changes until
then ride on it; a controller that exits syncs what is due first."""

from __future__ import annotations

from collections.abc import Callable

DELAY = 1.0  # seconds: how far the file may lag the hub


class CoalescedWrites:
    """``changed()`` for each change; ``write()`` runs once per burst, on the
    loop (``later(seconds, callback)``), or at ``flush()``."""

    def __init__(self, write: Callable[[], None], later: Callable[[float, Callable[[], None]], object], delay=DELAY):
        self.write, self.later, self.delay = write, later, delay
        self.due = False
        self.changes = self.writes = 0  # (for tests and stats)

    def changed(self) -> None:
        self.changes += 1
        if not self.due:
            self.due = True
            self.later(self.delay, self.flush)

    def flush(self) -> None:
        """Write now, if a change is not written yet."""
        if self.due:
            self.due = False
            self.writes += 1
            self.write()
