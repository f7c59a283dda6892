"""A controller launcher that follows its controller's keeper.

Our launchers start the controller's keeper (``launch.keeper``) and know the
controller by that process. If the keeper dies, the controller starts a new
keeper that adopts it (``controller.keeperwatch``) and names it in the keeper
file. The launcher then follows that keeper, so ``Cluster.stop`` and
``ipcluster stop`` still stop the controller (a SIGTERM to the keeper is
passed on), and a stop is reported only once the controller is gone.
"""

from __future__ import annotations

import time

import psutil
from traitlets import HasTraits

from ..compat import ipp
from ..controller.restarts import keeper_file, read_keeper_file

SUCCESSION_WAIT = 10.0  # seconds a launcher waits for the keeper that adopts a controller still running


def _alive(pid) -> bool:
    return isinstance(pid, int) and pid > 0 and psutil.pid_exists(pid)


def successor(profile_dir: str, cluster_id: str, dead: int) -> int | None:
    """The keeper (a pid) now keeping the controller whose keeper ``dead`` was, or None."""
    found = read_keeper_file(keeper_file(profile_dir, cluster_id))
    keeper = found.get("keeper")
    return keeper if keeper != dead and _alive(keeper) else None


class KeeperSuccession(HasTraits):
    """For a ``LocalProcessLauncher`` whose process is the controller's keeper."""

    @classmethod
    def from_dict(cls, d, **kwargs):
        """``ipcluster stop`` from another process: a keeper gone, its successor found."""
        pid = d.get("pid")
        if isinstance(pid, int) and pid > 0 and not psutil.pid_exists(pid):
            found = successor(d.get("profile_dir", ""), d.get("cluster_id", ""), pid)
            d = d if found is None else dict(d, pid=found)
        return super().from_dict(d, **kwargs)

    def signal(self, sig):
        """To the keeper in charge (a successor, if the first died)."""
        if self.state == "running" and not self.process.is_running():
            self._follow(self.pid, wait=0)
        return super().signal(sig)

    def notify_stop(self, data):
        """The keeper ended: if the controller runs on, its new keeper is followed."""
        if self.state == "running" and self._follow(data.get("pid"), wait=SUCCESSION_WAIT):
            return None
        return super().notify_stop(data)

    def _follow(self, dead, wait: float) -> bool:
        """Wait on the keeper that adopted the controller (up to ``wait`` s for it
        to be named, while the controller runs); False if there is none."""
        path, deadline = keeper_file(self.profile_dir, self.cluster_id), time.monotonic() + wait
        while True:
            keeper = successor(self.profile_dir, self.cluster_id, dead)
            if keeper is not None:
                break
            if time.monotonic() >= deadline or not _alive(read_keeper_file(path).get("controller")):
                return False
            time.sleep(0.1)  # (a keeper just died: its successor is being started; no event says when)
        if keeper == self.pid:  # (followed already)
            return True
        self.log.warning("The controller's keeper (pid %s) died; following pid %s, its successor", dead, keeper)
        self.process, self.pid = psutil.Process(keeper), keeper
        ipp.wait_on_process(self)
        update = getattr(self.parent, "update_cluster_file", None)
        if update is not None:
            update()
        return True
