"""``python -m ipyparallel_broadcast.launch.keeper [--restarts=5] [--window=60] -- CMD...``

Runs the controller command ``CMD`` and keeps it (settings: ``keepsettings``): when it dies
unasked (killed, out of memory, a crash; not an exit 0), it is started again
with ``--restore`` within the budget. Every launcher of ours runs the
controller so; a controller started by hand can be too. A SIGTERM, SIGINT
or SIGHUP (``ipcluster stop``, ``scancel``) is passed on to the controller
and ends the keeping. If its keeper dies, the controller gets ``KEEPER_GONE``
(not SIGTERM): it stops, keeping its engine journal and connection files, so a
controller started by hand with ``--restore`` takes its engines back (only an
orderly stop removes them). The exit status is the controller's last.

The controller says when it came up on a pipe (``controller.restarts.say_up``):
one whose first run never came up (a bad setting) is not restarted.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys

from ..controller.restarts import KEEPER_GONE, UP_FD_ENV
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
    die_with_parent(KEEPER_GONE)


class Keeper:
    """Runs ``cmd`` until it ends for good; ``run()`` gives its exit status."""

    def __init__(self, cmd: list[str], restarts: int, window: float):
        self.cmd, self.verdicts = list(cmd), Verdicts(restarts, window, log)
        self.child: subprocess.Popen | None = None

    def pass_on(self, sig, _frame):
        self.verdicts.stop_asked = True
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(sig)

    def run_once(self, argv: list[str]) -> tuple[int, bool]:
        """Run the controller to its end: its exit code, and whether it came up."""
        up_read, up_write = os.pipe()
        env = dict(os.environ, **{UP_FD_ENV: str(up_write)})
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
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- and the controller's command")
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("no controller command given")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s [keep] %(levelname)s | %(message)s")
    return Keeper(cmd, args.restarts, args.window).run()


if __name__ == "__main__":
    sys.exit(main())
