"""When a dead relay node is restarted, and when the controller gives up.

A node that keeps dying at once (a crash loop) is given up on; a node killed
now and then over a long life is always restarted. So the budget is a rate,
as systemd's ``StartLimitBurst`` in ``StartLimitIntervalSec``: at most
``limit`` restarts within any ``window`` seconds (the chaos soak killed the
root a dozen times in ten minutes, and a lifetime budget of 10 left the
cluster without a root).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import deque
from collections.abc import Callable

UP_FD_ENV = "IPB_CONTROLLER_UP_FD"  # a pipe to the controller's keeper (``launch.keeper``), told "up"
# the keeper's settings, given to the controller it keeps ({"restarts", "window", "cmd"}): a
# controller whose keeper died starts another with them (``keeperwatch``)
KEEPER_ENV = "IPB_KEEPER"
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


def keeper_settings() -> dict | None:
    """What this controller's keeper said of itself (None: not kept); taken from the environment."""
    try:
        settings = json.loads(os.environ.pop(KEEPER_ENV, "null"))
    except ValueError:
        return None
    if not isinstance(settings, dict) or not isinstance(settings.get("cmd"), list):
        return None
    return settings


def keeper_file(profile_dir: str, cluster_id: str = "") -> str:
    """Where a kept controller says which process keeps it now (its launcher stops that one)."""
    return os.path.join(profile_dir, "pid", f"ipb-keeper{'-' + cluster_id if cluster_id else ''}.json")


def write_keeper_file(path: str, keeper: int | None, controller: int) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temp = f"{path}.{os.getpid()}"
    with open(temp, "w") as f:
        json.dump(dict(keeper=keeper, controller=controller), f)
    os.replace(temp, path)  # (a reader never sees half of it)


def read_keeper_file(path: str) -> dict:
    """``{"keeper": pid or None, "controller": pid}``, or {} (none, or unreadable)."""
    try:
        with open(path) as f:
            found = json.load(f)
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}
