"""Where a new engine goes: the smallest free id on a least-loaded leaf.

The hub numbers engines; an engine's leaf is its id modulo the leaves
(``topology``). Counting every live engine for each new one made a burst of
N registrations O(N²), so the load per leaf is kept here instead, told by the
engine ledger as ids are granted, filed, dropped and withdrawn.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..wire.topology import least_loaded_id


class LeafLoads:
    """Live (or granted) engines per leaf; ``place(next_id)`` picks an id."""

    def __init__(self, n_leaves: int, live: Iterable[int] = ()):
        self.load = [0] * max(1, n_leaves)
        self.ids: set[int] = set()
        for eid in live:
            self.live(eid)

    def live(self, eid: int) -> None:
        if eid not in self.ids:
            self.ids.add(eid)
            self.load[eid % len(self.load)] += 1

    def gone(self, eid: int) -> None:
        if eid in self.ids:
            self.ids.remove(eid)
            self.load[eid % len(self.load)] -= 1

    def place(self, next_id: int) -> int:
        return least_loaded_id(next_id, self.load)
