"""The controller kept: started again, with ``--restore``, when it dies.

A controller that exits without being asked to (killed, out of memory, a
crash) is started again by its launcher on the same ports, keys and
connection files (``--restore`` reuses them), and takes back its engines
from its journal (``controller.restore``). Engines, host relays and clients
reconnect by themselves. Restarts are counted as the controller counts its
children's (``controller.restarts``): at most ``controller_restarts`` within
any ``controller_restart_window`` seconds; past that, the controller is left
dead and the launcher says so, and the cluster stops as it does today.

Before a restart, whatever is left of the dead controller's process group
(children that have not yet seen their parent die) is killed and waited
for, so that the new one finds its ports free.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
from traitlets import Float, HasTraits, Integer

from ..controller.restarts import RestartBudget

GROUP_WAIT = 10.0  # seconds to wait for a dead controller's children to be gone


class ControllerKeeping(HasTraits):
    """Mixin of a local controller launcher: a thread per controller process
    waits for it to end, and restarts it unless the launcher was asked to
    stop it or the budget is spent. (A thread, not the launcher's loop:
    under ``Cluster.start_and_connect_sync`` that loop no longer runs.)"""

    controller_restarts = Integer(
        5,
        config=True,
        help="How many times the controller is restarted (with --restore: engines, ids and "
        "clients kept) within controller_restart_window seconds; 0: never.",
    )
    controller_restart_window = Float(60.0, config=True, help="Seconds over which controller_restarts count.")

    restarted = 0  # times the controller was started again
    gave_up = False  # the budget was spent: the controller was left dead
    _stop_asked = False

    def keep(self, process) -> None:
        """Watch ``process`` (a ``psutil.Process``), the controller just started."""
        if not hasattr(self, "_keeper_verdicts"):
            self._keeper_lock = threading.Lock()
            self._keeper_verdicts: dict[int, bool] = {}
            self._keeper_budget = RestartBudget(max(self.controller_restarts, 0), self.controller_restart_window)
        threading.Thread(target=self._keep, args=(process,), name=f"ipb-keeper({process.pid})", daemon=True).start()

    def restarting(self, pid: int, data: dict) -> bool:
        """Whether the controller process ``pid``, which ended, is restarted
        (decided once per process, by whoever asks first)."""
        with self._keeper_lock:
            if pid not in self._keeper_verdicts:
                self._keeper_verdicts[pid] = self._keep_or_let_go(data)
            return self._keeper_verdicts[pid]

    def asked_to_stop(self) -> None:
        self._stop_asked = True

    def _keep_or_let_go(self, data: dict) -> bool:
        if self._stop_asked or self.controller_restarts <= 0:
            return False
        if not self._keeper_budget.allow():
            self.gave_up = True
            self.log.critical(
                "The controller exited (%s) and was restarted %i times in %g s: giving up",
                data,
                self.controller_restarts,
                self.controller_restart_window,
            )
            return False
        return True

    def _keep(self, process):
        try:
            code = process.wait()
        except psutil.Error:
            code = None
        data = dict(exit_code=code, pid=process.pid, identifier=getattr(self, "identifier", None))
        if not self.restarting(process.pid, data):
            return
        self.log.error("The controller exited unasked (%s): restarting it with --restore", data)
        if not group_gone(process.pid):
            self.log.warning("the dead controller's process group %s is still there", process.pid)
        if self._stop_asked:
            return
        self.restarted += 1
        self.start_again()


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
