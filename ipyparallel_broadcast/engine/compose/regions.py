"""Counting regions: extra threads from the host's token pool, kept fair while they run.

A region runs on ``max(1, tokens it holds)`` threads: never fewer than one,
never waiting unless asked to. Its fair share is ``ceil(cores / busy
engines)``. The engines of one broadcast start tens of milliseconds apart on
a loaded host, so a region that took the whole host because it started first
would keep it through its first NumPy call, whatever came next. Hence:

- a region starts above the engine's static budget only if the host's share
  has held steady for ``settle`` seconds (seen by the watcher, below);
- while regions run (and ``LINGER`` seconds after), a watcher thread looks at
  the host every ``interval`` seconds (``STEADY_SLOWDOWN`` times that while
  the share holds steady). When the share drops below what a region holds,
  or has risen and held steady, it asks the region's thread to rebalance:
  give back tokens, or take free ones, and set its pools to match.

Thread counts must be set by the thread that runs the region (OpenBLAS ignores
other threads once the main thread has set one; OpenMP counts are per
thread), so the request goes through ``Py_AddPendingCall``: it runs in the
main thread, where engines run requests, between two Python steps (two NumPy
calls, say). Regions opened in other threads keep the share they started with.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

LINGER = 1.0  # seconds the watcher keeps looking after the last region ends
STEADY_SLOWDOWN = 5  # the watcher looks this much less often while nothing changes

log = logging.getLogger(__name__)
_PENDING = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
_add_pending_call = ctypes.pythonapi.Py_AddPendingCall
_add_pending_call.argtypes = [_PENDING, ctypes.c_void_p]


@dataclass
class Region:
    want: int  # most threads the region asked for
    held: int  # tokens it holds
    threads: int  # threads it runs on
    main: bool  # opened in the main thread (so it can be rebalanced)


class Counting:
    def __init__(self, host, tokens, pools, cores: int, interval=0.01, settle=0.05):
        self.host, self.tokens, self.pools, self.cores = host, tokens, pools, cores
        self.interval, self.settle = interval, settle
        self.current = None
        self.lock = threading.RLock()  # a pending call may run while the main thread holds it
        self.hold = 0  # > 0 while a nested region runs: its count stays 1
        self.stats = {"regions": 0, "peak_threads": 0, "last_threads": None, "rebalanced": 0}
        self._share = None  # the host's fair share at the last look ...
        self._steady_since = self._looked_at = 0.0  # ... unchanged since, looked at then
        self._last_end = 0.0
        self._wake = threading.Event()
        self._closed = self._pending = False
        self._thread = None
        self._callback = _PENDING(self._in_main)  # kept alive as long as we are

    # -- the host's share ------------------------------------------------

    def look(self) -> int:
        """The fair share now (for a region that wants every core)."""
        share = -(-self.cores // self.host.busy_engines())
        now = time.monotonic()
        with self.lock:
            gap = now - self._looked_at > 2 * STEADY_SLOWDOWN * self.interval + 0.005  # unwatched
            if share != self._share or gap:
                self._share, self._steady_since = share, now
            self._looked_at = now
        return share

    def steady(self) -> bool:
        return time.monotonic() - self._steady_since >= self.settle

    # -- regions ---------------------------------------------------------

    @contextmanager
    def region(self, n, block: bool, rest: int):
        """Run on a fair share of tokens (yields the threads at the start);
        afterwards the pools go back to ``rest`` threads (the budget)."""
        want = max(1, min(n or self.cores, self.cores))
        share = min(want, self.look())
        take = share if self.steady() else min(share, max(1, rest))
        got = self.tokens.acquire_blocking(take) if block else self.tokens.acquire(take)
        with self.lock:
            main = threading.current_thread() is threading.main_thread()
            self.current = r = Region(want, got, max(1, got), main)
            self.pools.set(r.threads)
            self.stats["regions"] += 1
            self._seen(r.threads)
        self._start()
        try:
            yield r.threads
        finally:
            with self.lock:
                self.current = None
                self.pools.set(rest)
                self.tokens.release(r.held)
                self._last_end = time.monotonic()

    def rebalance(self) -> bool:
        """Move the open region to its share (in the region's thread); True if
        its thread count changed. It gives back at once, takes only when steady."""
        with self.lock:
            r = self.current
            if r is None or self.hold:
                return False
            share = min(r.want, self.look())
            if r.held > share:
                self.tokens.release(r.held - share)
                r.held = share
            elif r.held < share and self.steady():
                r.held += self.tokens.acquire(share - r.held)
            threads = max(1, r.held)
            if threads == r.threads:
                return False
            self.pools.set(threads)
            r.threads = threads
            self.stats["rebalanced"] += 1
            self._seen(threads)
            return True

    def _seen(self, threads):
        self.stats["peak_threads"] = max(self.stats["peak_threads"], threads)
        self.stats["last_threads"] = threads

    # -- the watcher -----------------------------------------------------

    def _start(self):
        if self.interval > 0:
            self._wake.set()
        if self._thread is None and self.interval > 0:
            self._thread = threading.Thread(target=self._watch, name="compose-watcher", daemon=True)
            self._thread.start()

    def _watch(self):
        while not self._closed:
            idle = self.current is None and time.monotonic() - self._last_end > LINGER
            if idle or self.interval <= 0:  # nothing to watch, or watching turned off
                self._wake.clear()
                if self.current is None or self.interval <= 0:
                    self._wake.wait()
                continue
            time.sleep(self.interval * (STEADY_SLOWDOWN if self.steady() else 1))
            share = self.look()
            r = self.current
            if r is not None and r.main and not self._pending and self._moved(r, share):
                self._pending = True
                if _add_pending_call(self._callback, None) != 0:  # queue full: next time
                    self._pending = False

    def _moved(self, r, share) -> bool:
        share = min(r.want, share)
        return r.held > share or (r.held < share and self.steady() and self.tokens.free() > 0)

    def _in_main(self, _arg) -> int:
        self._pending = False
        try:
            self.rebalance()
        except Exception:  # never raise into whatever the main thread was running
            log.exception(
                "compose: a region's rebalance failed; it keeps %s threads", getattr(self.current, "threads", None)
            )
        return 0

    def close(self):
        self._closed = True
        self._wake.set()
