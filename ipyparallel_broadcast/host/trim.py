"""Hand freed heap back to the OS now and then, as Dask's workers do.

A relay node receives, forwards and frees messages by the million, from two
threads (zmq's I/O thread allocates what the node's thread frees). Its Python
heap stays flat, but glibc keeps the freed pages, scattered, and the RSS
creeps up (the memory soak: +0.65 MB per 10,000 calls at the root).
``malloc_trim(0)`` returns them; it costs well under a millisecond on a relay's
heap, and runs at most every ``every`` seconds, only while messages flow,
and once more ``every`` seconds after the last message: a quiet node holds
only its live heap.
The client does the same on its I/O thread (``Client.heap_trim_interval``),
whose replies the user's thread frees. Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import time


def _malloc_trim():
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS)
        return None


class HeapTrimmer:
    """Calls ``malloc_trim(0)`` at most every ``every`` seconds, when messages
    came since the last (``owe``): the shell wakes at ``next_due``."""

    def __init__(self, every: float = 10.0):
        self.every = every
        self.trim = _malloc_trim()
        self.on = self.trim is not None and bool(every)
        self.due = float("inf")  # when the owed trim is due
        self.owed = False  # messages came since the last trim
        self.trims = 0
        self.longest = 0.0  # seconds, the longest trim so far

    def owe(self) -> None:
        """Messages came: a trim is owed, ``every`` seconds from now (at once
        called again until it is made)."""
        if self.on and not self.owed:
            self.owed = True
            self.due = time.monotonic() + self.every

    def next_due(self) -> float | None:
        """When the owed trim is due (``None``: none owed)."""
        return self.due if self.owed else None

    def maybe(self) -> None:
        """Trim if one is owed and due."""
        if self.owed and time.monotonic() >= self.due:
            self.run()
            self.owed = False

    def run(self) -> None:
        """Trim now, counted and timed."""
        tic = time.perf_counter()
        self.trim(0)
        self.trims += 1
        self.longest = max(self.longest, time.perf_counter() - tic)
