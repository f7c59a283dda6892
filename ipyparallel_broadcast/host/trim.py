"""Hand freed heap back to the OS now and then, as Dask's workers do.

A relay node receives, forwards and frees messages by the million, from two
threads (zmq's I/O thread allocates what the node's thread frees). Its Python
heap stays flat, but glibc keeps the freed pages, scattered, and the RSS
creeps up (the memory soak: +0.65 MB per 10,000 calls at the root).
``malloc_trim(0)`` returns them; it costs well under a millisecond on a relay's
heap, and runs at most every ``every`` seconds, only while messages flow.
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
    """Calls ``malloc_trim(0)`` at most every ``every`` seconds."""

    def __init__(self, every: float = 10.0):
        self.every = every
        self.trim = _malloc_trim()
        on = self.trim is not None and every
        self.due = time.monotonic() + every if on else float("inf")  # the shell checks it each loop turn
        self.trims = 0
        self.longest = 0.0  # seconds, the longest trim so far

    def maybe(self) -> None:
        if self.trim is None or not self.every:
            return
        now = time.monotonic()
        if now >= self.due:
            self.run()
            self.due = now + self.every

    def run(self) -> None:
        """Trim now, counted and timed."""
        tic = time.perf_counter()
        self.trim(0)
        self.trims += 1
        self.longest = max(self.longest, time.perf_counter() - tic)
