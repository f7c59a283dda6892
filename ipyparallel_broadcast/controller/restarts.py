"""When a dead relay node is restarted, and when the controller gives up.

A node that keeps dying at once (a crash loop) is given up on; a node killed
now and then over a long life is always restarted. So the budget is a rate,
as systemd's ``StartLimitBurst`` in ``StartLimitIntervalSec``: at most
``limit`` restarts within any ``window`` seconds (the chaos soak killed the
root a dozen times in ten minutes, and a lifetime budget of 10 left the
cluster without a root).
"""

from __future__ import annotations

import os
import signal
import time
from collections import deque
from collections.abc import Callable

UP_FD_ENV = "IPB_CONTROLLER_UP_FD"  # a pipe to the controller's keeper (``launch.keeper``), told "up"
# the signal a kept controller gets when its keeper dies (Linux's parent-death signal): not
# SIGTERM, which asks for an orderly stop; this one stops it keeping its journal (``app``)
KEEPER_GONE = signal.SIGUSR2


def say_up() -> None:
    """Tell the keeper, if any, that this controller came up (its files are
    written): one that dies later is restarted, one that never came up is not."""
    fd = os.environ.pop(UP_FD_ENV, None)
    if fd is None:
        return
    try:
        os.write(int(fd), b"up")
        os.close(int(fd))
    except (OSError, ValueError):
        pass


class RestartBudget:
    """``allow()``: whether one more restart fits in the last ``window`` seconds."""

    def __init__(self, limit: int, window: float, clock: Callable[[], float] = time.monotonic):
        self.limit, self.window, self.clock = limit, window, clock
        self.times: deque = deque()

    def allow(self) -> bool:
        """True (and counted) if fewer than ``limit`` restarts came in the window."""
        now = self.clock()
        while self.times and now - self.times[0] > self.window:
            self.times.popleft()
        if len(self.times) >= self.limit:
            return False
        self.times.append(now)
        return True
