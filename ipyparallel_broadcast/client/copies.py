"""What the client needs to send a broadcast again, sans I/O.

A controller (or its root relay) that dies loses the requests and replies on
their way through its relay nodes; the engines keep their replies until the
client has them (``engine/kept.py``). So a call the root lost is sent again
(``ReplyFiling.again``): the same signed request, its buffers not copied, in a
new envelope naming the engines still owed. Each call has a number, and each
request says the lowest one still owed: the engines let go of their replies
to the calls below it. A call goes again at most ``tries`` times; then it
fails, naming why.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class Copy:
    seq: int
    request: dict | None = None  # the envelope's content as first sent
    frames: list = field(default_factory=list)  # the signed request and its buffers
    copy: bool = True  # sent with zmq's copy (small buffers)
    tries: int = 0  # times sent again


class CallCopies:
    """The calls in flight by msg_id, in the order they were numbered. Numbers
    are given on the user's thread, the rest runs on the I/O thread: a lock."""

    def __init__(self, tries: int = 3):
        self.tries = tries
        self.owed: dict[str, Copy] = {}
        self._next = 0
        self._lock = threading.Lock()

    def number(self, msg_id: str) -> tuple[int, int]:
        """``(this call's number, the lowest one still owed)``."""
        with self._lock:
            seq, self._next = self._next, self._next + 1
            self.owed[msg_id] = Copy(seq)
            return seq, next(iter(self.owed.values())).seq

    def keep(self, msg_id: str, request: dict, frames: list, copy: bool):
        with self._lock:
            kept = self.owed.get(msg_id)
            if kept is not None:
                kept.request, kept.frames, kept.copy = request, frames, copy

    def done(self, msg_id: str):
        with self._lock:
            self.owed.pop(msg_id, None)

    def again(self, msg_id: str) -> Copy | None:
        """The copy to send again (its try counted), or None: unknown, or tried enough."""
        with self._lock:
            kept = self.owed.get(msg_id)
            if kept is None or kept.request is None or kept.tries >= self.tries:
                return None
            kept.tries += 1
            return kept
