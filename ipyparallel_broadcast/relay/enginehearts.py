"""A host relay's watch over its engines' hearts: heartbeats by host.

The hub's heart monitor pings host relays, not the engines behind them
(``controller.hostreg``). A relay answers each ping for its host and passes
it on to its engines, whose hearts (ipyparallel's own ``Heart``) answer on
the relay's socket. An engine still sees the hub's pings, and exits as ever
when they stop; the center sees one heart per host.

An engine that misses ``misses`` pings in a row is looked at. One whose
process is gone is dead: the hub unregisters it now. One whose process
lives is paused (a debugger, swap, a suspended job) and is kept for
``pause_limit`` seconds before it is given up. A relay that cannot see an
engine's process (a simulated engine) takes its silence for its death, as
the hub's heart monitor does. An engine's first answer says that its heart
beats: the hub files it then (``Registrar.beating``).

Sans-I/O: frames in, ``Send`` out to ``HUB_PONG`` (the relay's heart, a
DEALER to the heart monitor) and ``ENGINE_PING`` (a PUB to its engines).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..wire import protocol as P
from .events import Send

HUB_PONG, ENGINE_PING = "heart-up", "heart-down"
MISSES = 2  # pings an engine may miss before the relay looks at its process
PAUSE_LIMIT = 60.0  # seconds a paused engine is kept (``BroadcastController.engine_pause_limit``)


class EngineHearts:
    """The pings of one host's engines: who answers, who is silent, paused or dead."""

    def __init__(
        self, misses: int = MISSES, pause_limit: float = PAUSE_LIMIT, clock: Callable[[], float] = time.monotonic
    ):
        self.misses, self.pause_limit, self.clock = misses, pause_limit, clock
        self.round = 0  # pings passed on so far
        self.answered: dict[bytes, int] = {}  # heart -> the round of its last answer
        self.paused: dict[bytes, float] = {}  # heart -> since when its process is silent but alive
        self.first: list[str] = []  # engines whose heart answered for the first time, not yet told

    def hub_ping(self, frames) -> list[Send]:
        """A ping of the hub's heart monitor: answered for the host, passed on to the engines."""
        self.round += 1
        return [Send(HUB_PONG, list(frames)), Send(ENGINE_PING, list(frames))]

    def pong(self, frames):
        """An engine's heart answered (``[its identity, the ping]``)."""
        if len(frames) < 2:
            raise P.ProtocolError("a pong without its ping")
        heart = P.as_bytes(frames[0])
        if heart not in self.answered:
            self.first.append(heart.decode(errors="replace"))
        self.answered[heart] = self.round
        self.paused.pop(heart, None)

    def take_first(self) -> list[str]:
        first, self.first = self.first, []
        return first

    def silent(self, alive: Callable[[str], bool | None]) -> list[str]:
        """Engines to give up now. ``alive(uuid)``: whether the engine's process
        runs (None: the relay cannot tell, and silence is death)."""
        now, gone = self.clock(), []
        for heart, last in list(self.answered.items()):
            if self.round - last <= self.misses:
                continue
            uuid = heart.decode(errors="replace")
            if alive(uuid) and now - self.paused.setdefault(heart, now) < self.pause_limit:
                continue  # paused: kept, for a while
            gone.append(uuid)
            self.forget(uuid)
        return gone

    def forget(self, uuid: str):
        """The engine left (or was given up): no longer watched."""
        heart = uuid.encode()
        self.answered.pop(heart, None)
        self.paused.pop(heart, None)

    def stats(self) -> dict:
        return dict(hearts=len(self.answered), paused=len(self.paused), pings=self.round)
