"""The controller kept: started again, with ``--restore``, when it dies.

Every launcher of ours runs the controller under its keeper
(``python -m ipyparallel_broadcast.launch.keeper -- <controller command>``,
see ``keeper``), a small process beside it wherever it runs: a local process
(``Cluster``, ``ipcluster start``, daemonized or not), a Slurm job, an MPI
or ssh launch. A controller that exits without being asked to (killed, out
of memory, a crash) is started again there, on the same ports, keys and
connection files (``--restore`` reuses them), and takes back its engines
from its journal (``controller.restore``). Engines, host relays and
clients reconnect by themselves.

Restarts are counted as the controller counts its children's
(``controller.restarts``): at most ``controller_restarts`` within any
``controller_restart_window`` seconds; past that the controller is left
dead, said in the log, and the cluster ends as it did before. A controller
that never came up (a bad setting, a missing module) is not restarted: its
error is the launcher's to show. Before a restart, what is left of the dead
controller's process group is killed and waited for, so that the new one
finds its ports free.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from traitlets import Float, HasTraits, Integer

from ..controller.restarts import RestartBudget

RESTORE_ARGS = ["--restore", "--BroadcastController.restarted=True"]  # how a controller is started again
GROUP_WAIT = 10.0  # seconds to wait for a dead controller's children to be gone


class KeepSettings(HasTraits):
    """A controller launcher's restart budget, which its keeper is given."""

    controller_restarts = Integer(
        5,
        config=True,
        help="How many times the controller is restarted (with --restore: engines, ids and "
        "clients kept) within controller_restart_window seconds; 0: never (no keeper).",
    )
    controller_restart_window = Float(60.0, config=True, help="Seconds over which controller_restarts count.")

    def kept(self, cmd: list[str]) -> list[str]:
        """``cmd`` run under its keeper (as is if restarts are off)."""
        if self.controller_restarts <= 0:
            return list(cmd)
        budget = [f"--restarts={self.controller_restarts}", f"--window={self.controller_restart_window:g}"]
        return [sys.executable, "-m", "ipyparallel_broadcast.launch.keeper", *budget, "--", *cmd]


class Verdicts:
    """Whether a controller process that ended is started again: not if it
    exited 0 (a shutdown asked by a client, or a SIGTERM), not if it never
    came up, not once a stop was asked, not past the budget (``gave_up``)."""

    def __init__(self, restarts: int, window: float, log, clock=time.monotonic):
        self.restarts, self.window, self.log = restarts, window, log
        self.budget = RestartBudget(max(restarts, 0), window, clock)
        self.stop_asked = self.gave_up = False

    def restarting(self, data: dict, came_up: bool = True) -> bool:
        if self.stop_asked or self.restarts <= 0 or data.get("exit_code") == 0 or not came_up:
            return False
        if not self.budget.allow():
            self.gave_up = True
            self.log.critical(
                "The controller exited (%s) and was restarted %i times in %g s: giving up",
                data,
                self.restarts,
                self.window,
            )
            return False
        return True


def main_process(pid: int):
    """The controller's main process (a ``psutil.Process``) given the process
    its launcher started: that one, or, if it is a keeper, its child, or the
    running controller it adopted (None while it has none: between two runs)."""
    import psutil

    process = psutil.Process(pid)
    cmdline = process.cmdline()
    if "ipyparallel_broadcast.launch.keeper" not in cmdline:
        return process
    children = process.children()
    if len(children) == 1:
        return children[0]
    adopted = [a[len("--adopt=") :] for a in cmdline if a.startswith("--adopt=")]  # a keeper's successor
    try:
        found = psutil.Process(int(adopted[0])) if adopted and not children else None
        return None if found is None or found.status() == psutil.STATUS_ZOMBIE else found  # (dead: between runs)
    except (psutil.NoSuchProcess, ValueError):
        return None


def group_gone(pgid: int, timeout: float = GROUP_WAIT) -> bool:
    """Kill what is left of process group ``pgid``; True once none of it is left."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return True
    deadline = time.monotonic() + timeout
    delay = 0.005
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(delay)  # (polling a group: no event says it is empty)
        delay = min(delay * 2, 0.2)
    return False
