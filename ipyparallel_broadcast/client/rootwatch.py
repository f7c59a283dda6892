"""The client's watch on the root: which requests can no longer come back.

The root is the client's only peer on the broadcast socket. While requests
are in flight, the client pings it every ``interval`` seconds, listing the
requests it has waited on for at least that long; the root answers with those
it does not hold (``protocol``: ``ipb_ping`` / ``ipb_pong``). The socket is
first in, first out both ways, so a request listed was in the root's hands
before the ping, and a reply the root sent before its pong is handled before
it: a request the root does not know was lost (the root died and restarted,
or dropped it). A root that answers nothing for ``timeout`` seconds loses
everything in flight.

No socket monitor: a monitor whose reader is gone blocks its context's I/O
thread on the next event, and with it every socket of that context.
"""

from __future__ import annotations

import time
from collections.abc import Callable

LOST = "Relay node root lost the request (it restarted, or dropped the request)"


class RootWatch:
    def __init__(
        self, interval: float = 0.5, timeout: float = 10.0, clock: Callable[[], float] = time.monotonic, most: int = 256
    ):
        self.interval, self.timeout, self.clock, self.most = interval, timeout, clock, most
        self.in_flight: dict[str, float] = {}  # msg_id -> when it was handed to the socket
        self.unanswered: float | None = None  # when the oldest unanswered ping went out

    def sent(self, msg_id: str):
        self.in_flight[msg_id] = self.clock()

    def done(self, msg_id: str):
        self.in_flight.pop(msg_id, None)

    def tick(self) -> tuple[list[str], list[tuple[str, str]]]:
        """``(ids to ping about, [(msg_id, why)] lost)``."""
        now = self.clock()
        if not self.in_flight:
            self.unanswered = None
            return [], []
        if self.unanswered is not None and now - self.unanswered > self.timeout:
            why = f"Relay node root has not answered for {self.timeout:g} s"
            lost = [(m, why) for m, t in list(self.in_flight.items()) if t <= self.unanswered]
            for m, _ in lost:
                del self.in_flight[m]
            self.unanswered = None
            return [], lost
        ids = [m for m, t in list(self.in_flight.items()) if now - t >= self.interval][: self.most]
        if ids and self.unanswered is None:
            self.unanswered = now
        return ids, []

    def pong(self, unknown) -> list[tuple[str, str]]:
        """The root answered: the listed requests it does not hold are lost."""
        self.unanswered = None
        lost = [(m, LOST) for m in unknown if isinstance(m, str) and m in self.in_flight]
        for m, _ in lost:
            del self.in_flight[m]
        return lost
