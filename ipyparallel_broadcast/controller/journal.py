"""The hub's journal of record copies: kept unread, filed only when a query
may read the records (see ``records``), and bounded.

The bound counts engine outcomes (the records a copy makes) and bytes. Past
it, the oldest copies are dropped unfiled when the store is the in-memory DB
(which would cull their records anyway), and filed now with any other store.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

Handler = Callable[[list, list], None]


class Journal:
    """Copies waiting to be filed, oldest first: ``(handler, topics, message, outcomes)``."""

    def __init__(self, most: int, most_bytes: int, drops: bool, log: logging.Logger):
        self.entries: deque = deque()
        self.most, self.most_bytes, self.drops, self.log = most, most_bytes, drops, log
        self.outcomes = self.bytes = 0
        self.dropped = 0  # copies dropped unfiled (their records would have been culled)

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self):
        return iter(self.entries)

    def defer(self, handler: Handler, topics: list, message):
        """Keep a copy to file later; past the bounds, the oldest go. A root's
        bundle copy is labelled with the engine outcomes it carries: the bound
        counts those (the records they make), not copies."""
        label = topics[-1] if topics else b""
        outcomes = int(label) if isinstance(label, bytes) and label.isdigit() else 1
        self.entries.append((handler, topics, message, outcomes))
        self.outcomes += outcomes
        if isinstance(message, list):
            self.bytes += sum(len(f) for f in message)
        while len(self.entries) > 1 and (self.outcomes > self.most or self.bytes > self.most_bytes):
            if self.drops:
                self._forget(self.entries.popleft())
                self.dropped += 1
            else:
                self._file_one()

    def file_all(self):
        """File every copy waiting, oldest first."""
        while self.entries:
            self._file_one()

    def _forget(self, entry):
        self.outcomes -= entry[3]
        if isinstance(entry[2], list):
            self.bytes -= sum(len(f) for f in entry[2])

    def _file_one(self):
        entry = self.entries.popleft()
        self._forget(entry)
        handler, topics, message, _ = entry
        try:
            handler(topics, message)
        except Exception:  # one bad copy must not stop the others being filed
            self.log.error("broadcast:: could not file a record copy", exc_info=True)
