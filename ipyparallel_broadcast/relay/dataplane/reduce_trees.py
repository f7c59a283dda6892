"""A reduce's big values on their way to the leaf: one chain of hosts, or two trees (sans I/O).

The leaf picks the way by the alpha-beta model (``choose``; or
``BroadcastController.host_reduce_shape``) and plans it (``plans.reduce_way``):

- ``chain``: the hosts in a line, ordered by first engine id, the value in one
  part: ``v1 + (v2 + (... + vP))``. P hops.
- ``two trees`` (Sanders, Speck and Traeff): the value is cut in two halves on
  chunk boundaries, and half t goes up a binary tree of the hosts in heap
  order (host j sends to host (j - 1) // 2; each adds its own bytes, then its
  first feeder's, then its second's). The first tree takes the hosts in order,
  the second reversed, so the hosts that combine for one tree (the first
  P // 2 of its order) are leaves of the other: every host's link carries
  about one value each way, as in a chain, but a half takes floor(log2 P) + 1 hops.

Each part is a chain link at each host (``upchain.Chains``, keyed
``key#t``); this host's own value is cut into the parts' byte ranges
(``Uplinks``), and each part's root sends to the leaf, saying where its bytes
lie in the whole value (``at``, ``whole``).
"""

from __future__ import annotations

from ...wire import protocol as P
from .chains import Chains, within
from .chunks import parts
from .model import estimate
from .plans import CHAIN, TWO_TREES
from .pushplan import ASSUMED, MARGIN

SHAPES = ("auto", CHAIN, TWO_TREES)
MAX_PARTS = 2
KEPT = 4096  # cuts of values whose request went without a word here (bounded)


def part_key(key: str, t: int) -> str:
    return f"{key}#{t}"


def split_key(key) -> tuple[str, int]:
    """A part's link key: (the request's key, the part)."""
    base, _, t = key.rpartition("#") if isinstance(key, str) else ("", "", "")
    if not base or not t.isdigit() or int(t) >= MAX_PARTS:
        raise P.ProtocolError(f"chain message for {key!r}, not a part of a request")
    return base, int(t)


def choose(n_hosts: int, setting: str = "auto", chunk: int = 512 << 10) -> str:
    """The way for ``n_hosts``: two trees once the model puts them ``MARGIN``
    times ahead of a chain (from about 60 hosts), else a chain."""
    if setting != "auto":
        return setting
    m = 64 * chunk  # (the order does not depend on the size: both move one value per link)
    chain = estimate("pipelined tree", n_hosts, m, ASSUMED, 1).seconds
    return TWO_TREES if chain >= MARGIN * estimate("two trees", n_hosts, m, ASSUMED).seconds else CHAIN


class Uplinks:
    """A host relay's own big reduce values, cut into their parts' links."""

    def __init__(self, chains: Chains):
        self.chains = chains
        self.parts: dict[str, int] = {}  # request key -> its parts, until this host's value is given
        self.striped: dict[str, int] = {}  # request key -> the size of a value that comes in stripes

    def join(self, key: str, op: str, content) -> None:
        """A reduce request came with this host's place in each part."""
        parts = content.get("parts") if isinstance(content, dict) else None
        if not (isinstance(parts, list) and 1 <= len(parts) <= MAX_PARTS) or key in self.parts:
            raise P.ProtocolError(f"bad chain content for {key!r}")
        try:
            for t, part in enumerate(parts):
                self.chains.join(part_key(key, t), op, part)
        except P.ProtocolError:
            self.chains.end([part_key(key, t) for t in range(len(parts))])
            raise
        self.parts[key] = len(parts)
        while len(self.parts) > KEPT:
            self._forget(next(iter(self.parts)))

    def _views(self, key: str, n: int, header: dict, data) -> list[tuple[str, dict, memoryview]]:
        """Each part's link key, value header and bytes of this host's value."""
        view = memoryview(data).cast("B")
        return [
            (part_key(key, t), dict(header, at=lo, whole=view.nbytes), view[lo:hi])
            for t, (lo, hi) in enumerate(parts(view.nbytes, self.chains.chunk, n))
        ]

    def ranges(self, key: str, nbytes: int) -> list[tuple[int, int]]:
        """The byte ranges of an ``nbytes`` value's parts, in part order."""
        return parts(nbytes, self.chains.chunk, self.parts.get(key, 1))

    def own_begin(self, key: str, header: dict, data) -> bool:
        """This host's value will be final in ``data`` stripe by stripe."""
        if key not in self.parts:
            return False
        views = self._views(key, self.parts[key], header, data)
        if not all(self.chains.own_begin(k, h, v) for k, h, v in views):
            return False
        self.striped[key] = memoryview(data).nbytes
        return True

    def own_ready(self, key: str, ranges) -> list:
        """These byte ranges ``(lo, hi)`` of this host's value are final (a
        part whose link is done already takes nothing more)."""
        if key not in self.striped:
            return []
        sends = []
        for t, (lo, hi) in enumerate(self.ranges(key, self.striped[key])):
            sends += self.chains.own_ready(part_key(key, t), within(ranges, lo, hi))
        return sends

    def _forget(self, key: str) -> None:
        self.parts.pop(key, None)
        self.striped.pop(key, None)

    def own_value(self, key: str, header: dict | None, data) -> list:
        """This host's engines are all in: its own big value (or None: it has none)."""
        n = self.parts.get(key)
        self._forget(key)
        if n is None:
            return []
        if header is None:
            return [s for t in range(n) for s in self.chains.own_value(part_key(key, t), None, None)]
        sends = []
        for k, h, v in self._views(key, n, header, data):
            sends += self.chains.own_value(k, h, v) if v.nbytes else self.chains.own_value(k, None, None)
        return sends

    def consumed(self, key: str) -> bool:
        return any(self.chains.consumed(part_key(key, t)) for t in range(MAX_PARTS))

    def abort(self, key: str, why: str) -> list:
        self._forget(key)
        return [s for t in range(MAX_PARTS) for s in self.chains.abort(part_key(key, t), why)]

    def end(self, keys) -> list:
        """The leaf gave up on these requests' values."""
        for key in keys:
            self._forget(key)
        return self.chains.end([part_key(k, t) for k in keys for t in range(MAX_PARTS)])
