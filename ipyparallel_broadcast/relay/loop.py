"""The event loop of a process's relay shells: one zmq poller for them all.

A relay node's process runs one shell (``shell.NodeShell``); the simulated
farm (``tools.sim``) runs many host relays in one process, each with its own
node and sockets, so that a thousand hosts fit on one machine. Both run here:
the loop polls every shell's sockets at once, hands each ready socket to the
shell that owns it, and wakes each shell when its own next deadline comes.
"""

from __future__ import annotations

import time

import zmq


class ShellLoop:
    """Poll the sockets of many shells; a shell stops when ``running()`` says so."""

    def __init__(self):
        self.poller = zmq.Poller()
        self.owner: dict[zmq.Socket, object] = {}  # socket -> the shell it belongs to
        self.shells: list = []

    def add(self, shell):
        """Start serving ``shell``: its ``begin`` runs, then its sockets are polled."""
        shell.loop = self
        shell.begin()
        for sock in shell.sockets:
            self.register(shell, sock)
        self.shells.append(shell)

    def register(self, shell, sock: zmq.Socket):
        """A socket ``shell`` opened (at start, or later: a host relay's pulse link)."""
        self.owner[sock] = shell
        self.poller.register(sock, zmq.POLLIN)

    def unregister(self, sock: zmq.Socket):
        self.poller.unregister(sock)
        self.owner.pop(sock, None)

    def run(self):
        """Until no shell runs. Each turn: read what came (``NodeShell.read``);
        then each shell that read, or whose deadline came, sends what it held
        for the batch (``drained``), and one whose deadline came fires its
        timers (``on_tick``): a turn that only read asks no timer (a deadline
        a message set comes on a later turn, the poll's timeout made from it)."""
        while self.shells:
            deadlines = [(shell, shell.next_deadline()) for shell in self.shells]
            soonest = min((d for _, d in deadlines if d is not None), default=None)
            timeout = None if soonest is None else max(0.0, soonest - time.monotonic()) * 1e3
            touched = set()
            for sock, _ in self.poller.poll(timeout):
                shell = self.owner.get(sock)
                if shell is not None:  # (not closed by another's handler this turn)
                    shell.read(sock)
                    touched.add(shell)
            now = time.monotonic()
            for shell, deadline in deadlines:
                due = deadline is not None and deadline <= now
                if shell in touched or due:
                    shell.after_turn(ticked=due)
                    if not shell.running():
                        self.remove(shell)

    def remove(self, shell):
        """``shell`` stopped: its sockets are no longer polled; it finishes (``NodeShell.finish``)."""
        for sock in [s for s, owner in self.owner.items() if owner is shell]:
            self.unregister(sock)
        self.shells.remove(shell)
        shell.finish()
