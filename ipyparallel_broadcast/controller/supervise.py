"""Every process the controller starts is watched, restarted in place, and
dies with it.

The controller's children are the relay nodes and the queues that carry
IPython Parallel's own traffic (mux, control, task, IOPub) and its heart
monitor. One that exits while the controller runs is started again with the
same arguments, so on the same ports, and engines and clients reconnect to
it by themselves. Restarts are counted per child in a ``RestartBudget`` (a
crash loop is given up on, and said so). What the dead one held is failed
by whoever waited on it: the relay tree by its parent node, the queues by
the clients, told by a notice (``notices``).

Each child process is named (``/proc/<pid>/comm``: ``ipb-mux``, ``ipb-node-1``),
so ``ps``, ``top`` and a test's nemesis tell them apart, and it is killed
when the controller dies, even by SIGKILL (Linux's parent-death signal): no
orphan keeps a port that the next controller needs, or relays for a hub
that is gone.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing import Process

from .restarts import RestartBudget

PR_SET_PDEATHSIG, PR_SET_NAME = 1, 15  # <linux/prctl.h>


def _prctl(option: int, arg) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(option, arg, 0, 0, 0)


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask Linux for ``sig`` when this process's parent dies (no-op elsewhere)."""
    if sys.platform.startswith("linux"):
        _prctl(PR_SET_PDEATHSIG, sig)


def as_child(target: Callable, comm: str, parent: int, kwargs: dict):
    """A child process's entry point: named ``comm``, ended by SIGTERM when
    its parent dies, then ``target(**kwargs)``."""
    if sys.platform.startswith("linux"):
        _prctl(PR_SET_NAME, ctypes.c_char_p(comm.encode()[:15]))
        _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # it died before the signal was asked for
            os._exit(1)
    target(**kwargs)


def child_process(target: Callable, name: str, comm: str, kwargs: dict) -> Process:
    """A daemon ``Process`` running ``target(**kwargs)`` as ``as_child`` does."""
    return Process(
        target=as_child,
        kwargs=dict(target=target, comm=comm, parent=os.getpid(), kwargs=kwargs),
        name=name,
        daemon=True,
    )


@dataclass
class Child:
    """One supervised process: ``make()`` gives a new, unstarted one."""

    name: str
    make: Callable[[], Process]
    budget: RestartBudget
    process: Process | None = None
    given_up: bool = False
    restarts: int = 0
    on_restart: list = field(default_factory=list)  # callbacks (child, old Process), after a restart


@dataclass
class Exit:
    """What ``Supervisor.check`` did about one child that exited."""

    child: Child
    old: Process
    new: Process | None  # None: given up on


class Supervisor:
    """The controller's children, by name. ``check()`` restarts those that
    exited (not once ``stop()`` was called) and returns what it did."""

    def __init__(self, limit: int, window: float):
        self.limit, self.window = limit, window
        self.children: dict[str, Child] = {}
        self.stopping = False

    def add(self, name: str, make: Callable[[], Process], process: Process | None = None) -> Child:
        child = Child(name, make, RestartBudget(self.limit, self.window))
        child.process = process if process is not None else make()
        self.children[name] = child
        return child

    def processes(self) -> list[Process]:
        return [c.process for c in self.children.values() if c.process is not None]

    def check(self) -> list[Exit]:
        exits = []
        for child in self.children.values():
            old = child.process
            if self.stopping or old is None or child.given_up or old.pid is None or old.exitcode is None:
                continue
            if not child.budget.allow():
                child.given_up = True
                exits.append(Exit(child, old, None))
                continue
            child.process = child.make()
            child.process.start()
            child.restarts += 1
            exits.append(Exit(child, old, child.process))
        return exits

    def stop(self):
        self.stopping = True
