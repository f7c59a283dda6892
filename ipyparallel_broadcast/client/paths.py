"""Which way a collective goes, tree or direct, from the times of past calls.

The tree sends one message per call but moves every byte through each of its
levels; DirectView's path (the hub's mux) sends one message per engine and
moves each byte once. So the tree wins with many engines and loses with few
engines and many bytes (the thesis's section 7.1; the crossover depends on
the machine, the tree's depth and the load). ``PathChooser`` learns it per
operation and size class (engines and bytes, in powers of two): the first
two calls of a class go by the tree, the next two directly (the first of
each warms it up, and its time is dropped), then each call takes the path
whose median time over its last ``KEPT`` calls is lower (one slow call, a
collection or a burst of page faults, does not flip the choice), the other
being tried again now and then (after more calls the slower it was), so a
change in the cluster is followed.
Sans I/O: the view asks, times its calls and tells.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

TREE, DIRECT = "tree", "direct"
PATHS = (TREE, DIRECT)


def size_class(engines: int, nbytes: int) -> tuple[int, int]:
    """Engines and bytes, each rounded to its power of two."""
    return max(engines, 1).bit_length(), max(int(nbytes), 1).bit_length()


class PathChooser:
    """Per (operation, size class): each path's smoothed time, and the calls
    since the slower one was last tried."""

    MAX_SLOWER = 8  # a slower path is tried again within retry_every x 8 calls at most
    KEPT = 5  # each path's last times, whose median is its time

    def __init__(self, retry_every: int = 16, max_direct: int = 64):
        self.retry_every = retry_every  # calls between tries of the slower path (x how much slower)
        self.max_direct = max_direct  # engines beyond which the direct path is never tried
        self.times: dict[tuple, float] = {}  # (op, class, path) -> its median recent time
        self.recent: dict[tuple, deque] = {}
        self.counts: dict[tuple, int] = {}
        self.since: dict[tuple, int] = {}
        self.sizes: dict[str, int] = {}  # bytes a gather of each key last brought back

    def remember_size(self, key: str, nbytes: int, keep: int = 1024) -> None:
        """A gather's size, to class the next gather of ``key`` (the newest ``keep`` keys)."""
        self.sizes.pop(key, None)
        self.sizes[key] = nbytes
        if len(self.sizes) > keep:
            del self.sizes[next(iter(self.sizes))]

    def choose(self, op: str, engines: int, nbytes: int) -> str:
        if engines > self.max_direct:
            return TREE
        key = (op, *size_class(engines, nbytes))
        for path in PATHS:  # each path twice first: a first call also pays for warming up
            if self.counts.get(key + (path,), 0) < 2:
                return path
        tree, direct = self.times[key + (TREE,)], self.times[key + (DIRECT,)]
        best, other = (TREE, DIRECT) if tree <= direct else (DIRECT, TREE)
        slower = max(tree, direct) / max(min(tree, direct), 1e-9)
        since = self.since.get(key, 0) + 1
        if since >= self.retry_every * math.ceil(min(slower, self.MAX_SLOWER)):
            self.since[key] = 0
            return other
        self.since[key] = since
        return best

    def record(self, op: str, engines: int, nbytes: int, path: str, seconds: float) -> None:
        if path not in PATHS or not seconds >= 0:
            raise ValueError(f"bad record: path {path!r}, {seconds!r} s")
        key = (op, *size_class(engines, nbytes), path)
        count = self.counts[key] = self.counts.get(key, 0) + 1
        if count == 1:  # a first call also pays for warming up: not kept
            self.times[key] = seconds
            return
        recent = self.recent.setdefault(key, deque(maxlen=self.KEPT))
        recent.append(seconds)
        self.times[key] = statistics.median(recent)
