"""The controller's keeper, watched from the controller (issue 73).

A keeper (``launch.keeper``) starts the controller, and starts it again when
it dies. When the keeper dies instead, Linux tells the controller
(``KEEPER_GONE``, its parent-death signal), and the controller starts a new
keeper that adopts it (``--adopt``): that one waits on the controller's pid,
and starts it again with ``--restore`` if it dies without an orderly stop
(which alone deletes the engine journal). The new keeper is the
controller's child in a session of its own, so the controller's death does
not take it along; the controller looks at it every second and starts
another if it died, within a budget.

The keeper in charge is written to the keeper file (``restarts.keeper_file``),
where our launcher finds the process to stop (``launch.launcher``), and is
told to clients in each beat: a controller left without a keeper says so in
its log and in ``rc.broadcast_tree()``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from .restarts import KEEPER_ENV, UP_FD_ENV, RestartBudget, write_keeper_file

KEEPER_MODULE = "ipyparallel_broadcast.launch.keeper"


class KeeperWatch:
    """``settings``: the keeper's (``restarts.keeper_settings``), None if this
    controller is not kept; ``path``: the keeper file; ``journal``: the
    engine journal, whose presence tells an adopting keeper that the
    controller did not stop in order. ``facts`` is read by the beats' thread."""

    def __init__(self, log, settings: dict | None, path: str, journal: str, budget: RestartBudget | None = None):
        self.log, self.settings, self.path, self.journal = log, settings, path, journal
        self.budget = budget or RestartBudget(5, 60.0)
        self.child: subprocess.Popen | None = None  # a keeper this controller started
        self.adopted = 0  # keepers started so
        self.facts = dict(keeper=os.getppid() if settings else None, adopted=0)

    def start(self) -> None:
        """Say who keeps this controller (nothing if no one does); a keeper that
        died before the controller could hear it (its signal is ignored until
        now) is replaced now."""
        if self.settings is None:
            return
        write_keeper_file(self.path, self.facts["keeper"], os.getpid())
        if self.settings.get("pid") not in (None, self.facts["keeper"]):
            self.lost()

    def lost(self) -> None:
        """The keeper died: start one that adopts this controller (the loop's thread)."""
        dead = self.facts["keeper"]
        if self.settings is None or not self.budget.allow():
            self._alone(f"its keeper (pid {dead}) died, and no other is started (past the budget)")
            return
        try:
            self.child = subprocess.Popen(self.command(), env=self._env(), start_new_session=True)
        except OSError as e:
            self._alone(f"its keeper (pid {dead}) died, and another could not be started: {e}")
            return
        self.adopted += 1
        self.facts = dict(keeper=self.child.pid, adopted=self.adopted)
        write_keeper_file(self.path, self.child.pid, os.getpid())
        self.log.critical("The controller's keeper (pid %s) died: keeper pid %s adopts it", dead, self.child.pid)

    def check(self) -> None:
        """Every second (the loop's thread): a keeper this controller started that died is replaced."""
        if self.child is not None and self.child.poll() is not None:
            self.log.error("The controller's keeper (pid %s) exited with %s", self.child.pid, self.child.returncode)
            self.child = None
            self.lost()

    def command(self) -> list[str]:
        s = self.settings
        return [
            sys.executable,
            "-m",
            KEEPER_MODULE,
            f"--restarts={s.get('restarts', 5)}",
            f"--window={s.get('window', 60.0)}",
            f"--adopt={os.getpid()}",
            f"--journal={self.journal}",
            "--",
            *s["cmd"],
        ]

    def _env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if k != UP_FD_ENV}
        env[KEEPER_ENV] = json.dumps(self.settings)
        return env

    def _alone(self, why: str) -> None:
        self.facts = dict(keeper=None, adopted=self.adopted)
        write_keeper_file(self.path, None, os.getpid())
        self.log.critical("The controller runs without a keeper: %s; if it dies, it is not restarted", why)

    def stop(self) -> None:
        """An orderly stop: the keeper file goes (the adopting keeper ends as the controller does)."""
        try:
            os.remove(self.path)
        except FileNotFoundError:
            pass
