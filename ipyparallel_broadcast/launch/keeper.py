"""``python -m ipyparallel_broadcast.launch.keeper [--restarts=5] [--window=60] -- CMD...``

Runs the controller command ``CMD`` and keeps it (settings: ``keepsettings``): when it dies
unasked (killed, out of memory, a crash; not an exit 0), it is started again
with ``--restore`` within the budget. Every launcher of ours runs the
controller so; a controller started by hand can be too. A SIGTERM, SIGINT
or SIGHUP (``ipcluster stop``, ``scancel``) is passed on to the controller
and ends the keeping. If its keeper dies, the controller gets ``KEEPER_GONE``
and starts a new keeper with ``--adopt=<its pid>`` (``controller.keeperwatch``):
that one keeps the running controller (it is not its child: it waits on its
pid) and, if it dies without an orderly stop (its ``--journal`` is still
there), starts it again with ``--restore``. The exit status is the controller's last.

The controller says when it came up on a pipe (``controller.restarts.say_up``):
one whose first run never came up (a bad setting) is not restarted.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import select
import signal
import subprocess
import sys

from ..controller.restarts import KEEPER_ENV, KEEPER_GONE, UP_FD_ENV
from ..controller.supervise import die_with_parent
from .keepsettings import RESTORE_ARGS, Verdicts, group_gone

log = logging.getLogger("ipyparallel_broadcast.keep")


def _said_up(fd: int) -> bool:
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 16).startswith(b"up")
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def _dies_with_keeper():
    """In the controller's process, before it runs: told ``KEEPER_GONE`` if its
    keeper dies, ignored until it can handle it (its default would end it;
    a keeper gone before then is seen at start: ``keeperwatch``)."""
    signal.signal(KEEPER_GONE, signal.SIG_IGN)
    die_with_parent(KEEPER_GONE)


def wait_for(pid: int) -> None:
    """Until process ``pid`` (not a child of ours) has ended."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while not poller.poll():  # (a signal's handler ran: poll again)
            pass
    finally:
        os.close(fd)


class Keeper:
    """Runs ``cmd`` until it ends for good; ``run()`` gives its exit status.
    With ``adopt`` (a pid), a controller already running, whose keeper died,
    is kept first (``controller.keeperwatch``)."""

    def __init__(self, cmd: list[str], restarts: int, window: float, adopt: int | None = None, journal: str = ""):
        self.cmd, self.verdicts = list(cmd), Verdicts(restarts, window, log)
        self.settings = json.dumps(dict(restarts=restarts, window=window, cmd=self.cmd, pid=os.getpid()))
        self.child: subprocess.Popen | None = None
        self.adopt, self.journal = adopt, journal

    def pass_on(self, sig, _frame):
        self.verdicts.stop_asked = True
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(sig)
        elif self.child is None and self.adopt is not None:
            try:
                os.kill(self.adopt, sig)
            except ProcessLookupError:
                pass

    def adopted_ended(self) -> int | None:
        """Keep the adopted controller until it ends: the exit status to give
        (it stopped in order: its journal is gone), or None to start it again."""
        pid = self.adopt
        log.info("Keeping the running controller, pid %s (its keeper died)", pid)
        wait_for(pid)
        self.adopt = None
        if self.verdicts.stop_asked or not os.path.exists(self.journal):
            return 0
        if not group_gone(pid):
            log.warning("the dead controller's process group %s is still there", pid)
        if not self.verdicts.restarting(dict(exit_code=None, pid=pid)):
            return 1
        log.error("The controller (pid %s) died: restarting it with --restore", pid)
        return None

    def run_once(self, argv: list[str]) -> tuple[int, bool]:
        """Run the controller to its end: its exit code, and whether it came up."""
        up_read, up_write = os.pipe()
        env = dict(os.environ, **{UP_FD_ENV: str(up_write), KEEPER_ENV: self.settings})
        self.child = subprocess.Popen(  # its own group, killed whole before a restart
            argv, env=env, pass_fds=(up_write,), start_new_session=True, preexec_fn=_dies_with_keeper
        )
        os.close(up_write)
        code = self.child.wait()
        return code, _said_up(up_read)

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self.pass_on)
        argv, came_up = self.cmd, False
        if self.adopt is not None:
            code = self.adopted_ended()
            if code is not None:
                return code
            argv, came_up = self.cmd + RESTORE_ARGS, True
        while True:
            code, up = self.run_once(argv)
            came_up, pid = came_up or up, self.child.pid
            if not self.verdicts.restarting(dict(exit_code=code, pid=pid), came_up):
                return code if code >= 0 else 128 - code
            log.error("The controller (pid %s) exited with %s: restarting it with --restore", pid, code)
            if not group_gone(pid):
                log.warning("the dead controller's process group %s is still there", pid)
            argv = self.cmd + RESTORE_ARGS


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ipyparallel_broadcast.launch.keeper", description=__doc__)
    parser.add_argument("--restarts", type=int, default=5, help="restarts allowed within --window seconds")
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--adopt", type=int, help="the pid of a running controller whose keeper died, kept first")
    parser.add_argument("--journal", default="", help="with --adopt: its engine journal (gone: it stopped in order)")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- and the controller's command")
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("no controller command given")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s [keep] %(levelname)s | %(message)s")
    return Keeper(cmd, args.restarts, args.window, args.adopt, args.journal).run()


if __name__ == "__main__":
    sys.exit(main())
