"""What a node sends, in its first seconds, to a peer not connected yet.

A controller restarted starts its relay nodes together; a client's call sent
again may reach the new root before a leaf below it has connected, or a leaf
before its engines' sockets have reconnected. A ``ROUTER`` then says the peer
is unreachable, and the node would fail the call for engines that are alive.
So, for ``grace`` seconds after the node starts, such a message is held and
tried again at the next tick; after that, a peer that cannot be reached is
lost as before. Sans I/O: the shell holds and retries (``shell.perform``).
"""

from __future__ import annotations

from collections.abc import Callable

RETRY = 0.1  # seconds between tries while messages are held


class StartupHold:
    """Messages held per peer (its routing id, ``frames[0]``), in order: once
    one is held, the peer's next ones wait behind it (a ping must not overtake
    the request it asks about)."""

    def __init__(self, clock: Callable[[], float], grace: float):
        self.clock, self.until = clock, clock() + grace
        self.held: dict[bytes, list[list]] = {}
        self.due: float | None = None  # when the held messages are tried again
        self.retried = 0  # messages tried again (tests read it)

    def waiting(self, frames: list) -> bool:
        """Is ``frames``'s peer's earlier message held? Then this one is held behind it."""
        if not self.held:
            return False
        queue = self.held.get(bytes(frames[0]))
        if queue is None:
            return False
        queue.append(frames)
        return True

    def hold(self, frames: list) -> bool:
        """Hold ``frames`` for another try: False once the grace is over (the peer is lost)."""
        if self.clock() >= self.until:
            return False
        if not self.held:
            self.due = self.clock() + RETRY
        self.held.setdefault(bytes(frames[0]), []).append(frames)
        return True

    def take(self) -> list[list]:
        """The held messages, to send again now, each peer's in order."""
        held, self.held, self.due = self.held, {}, None
        taken = [frames for queue in held.values() for frames in queue]
        self.retried += len(taken)
        return taken
