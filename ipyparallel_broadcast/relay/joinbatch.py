"""Engines that joined a host relay, held for one announcement to its leaf."""

from __future__ import annotations

# each announcement is a route up the tree and its acknowledgement back: the engines of one
# host that register together go in one, held at most this long for those still registering
JOIN_WINDOW = 0.25


class JoinBatch:
    """Joins, ``(eid, uuid, who, shm)`` each, held until none of the host's
    engines is still registering, or ``window`` seconds after the first."""

    def __init__(self, window: float = JOIN_WINDOW):
        self.window = window
        self.entries: list[tuple] = []
        self.due: float | None = None  # when they go, whoever is still registering

    def add(self, entry: tuple, now: float) -> None:
        self.entries.append(entry)
        if self.due is None:
            self.due = now + self.window

    def take(self, now: float, registering: bool) -> list[tuple]:
        """The joins to announce now (none while others register, until ``due``)."""
        if not self.entries or (registering and now < self.due):
            return []
        entries, self.entries, self.due = self.entries, [], None
        return entries

    def __bool__(self) -> bool:
        return bool(self.entries)
