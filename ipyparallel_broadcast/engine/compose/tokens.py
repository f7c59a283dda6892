"""A host-wide pool of thread tokens: one ``flock``-ed file per core.

Holding the lock on ``token-<i>`` is holding token i. Nothing is written, so
there is nothing to repair: when a process dies, even by SIGKILL, the kernel
drops its locks and its tokens are free again.
"""

from __future__ import annotations

import time

from ...host.composedir import try_lock, unlock
from .host import LockFiles


class TokenPool:
    def __init__(self, path: str, size: int, start: int = 0):
        """``size`` tokens in directory ``path``; searches begin at token ``start``
        (the engine's rank), so engines do not all contend for token 0."""
        self.size = size
        self.files = LockFiles(path, "token")
        self.start = start % size
        self.held: list = []

    def acquire(self, n: int) -> int:
        """Take up to ``n`` free tokens without waiting; return how many were taken."""
        taken = 0
        for k in range(self.size):
            if taken == n:
                break
            i = (self.start + k) % self.size
            if i not in self.held and try_lock(self.files.fd(i)):
                self.held.append(i)
                taken += 1
        return taken

    def acquire_blocking(self, n: int, poll: float = 0.001, cap: float = 0.05) -> int:
        """Wait for at least one token, then take up to ``n``."""
        while True:
            taken = self.acquire(n)
            if taken:
                return taken
            time.sleep(poll)
            poll = min(cap, poll * 2)

    def release(self, n: int) -> None:
        """Give back the ``n`` tokens taken last."""
        for _ in range(n):
            unlock(self.files.fd(self.held.pop()))

    def free(self) -> int:
        """Tokens nobody holds right now (a snapshot)."""
        return sum(1 for i in range(self.size) if i not in self.held and not self.files.held_elsewhere(i))

    def close(self):
        self.files.close()
        self.held.clear()
