"""The controller's children, supervised: which processes it starts for
IPython Parallel's traffic (the queues, the task scheduler, the heart
monitor) and for the tree (relay nodes), how each is restarted when it dies
(``supervise``), and the clients told (``notices``).

What each death means for a call, and what a user sees, is in
``docs/deployment.md`` ("When a part of the controller dies").
"""

from __future__ import annotations

from functools import partial
from threading import Thread

from ipyparallel.controller.scheduler import launch_scheduler
from tornado.ioloop import PeriodicCallback

from ..compat import ipp
from ..host.shm import sweep
from ..wire import protocol as P
from .heart import start_heart_monitor
from .notices import Notices
from .restarts import say_up
from .supervise import Supervisor, child_process
from .taskqueue import RestartableTaskScheduler

# the queues' process names, and the client channel each carries (its clients are told when it dies)
CHANNELS = {
    "DirectScheduler": ("mux", "ipb-mux"),
    "ControlScheduler": ("control", "ipb-control"),
    "TaskScheduler": ("task", "ipb-task"),
    "IOPubScheduler": ("iopub", "ipb-iopub"),
}


class ChildSupervision:
    """A part of ``BroadcastController``: its children supervised and its
    clients told (``notices``). ``app`` is the controller (an
    ``IPController``); the part reads its settings and addresses, and keeps
    its ``children`` list and ``heartmonitor_process`` pointing at the live
    processes, as ipyparallel stops them by those."""

    def __init__(self, app):
        self.app = app
        self.supervisor = Supervisor(app.node_restarts, app.node_restart_window)
        self.notices: Notices | None = None

    @property
    def notices_port(self):
        """The port of the clients' notices socket (``notices``), picked once."""
        app = self.app
        if P.NOTICES_KEY not in app.client_info:
            app.client_info[P.NOTICES_KEY] = app.next_port("client")
        return app.client_info[P.NOTICES_KEY]

    def add(self, name: str, make) -> object:
        """A child process of ours (``make()`` starts it), restarted when it dies."""
        return self.supervisor.add(name, make).process

    def replace_queue(self, name: str, target, spec: dict):
        """ipyparallel's queue ``name``, ours in its place (a supervised process, or a thread)."""
        app = self.app
        (stock,) = [c for c in app.children if getattr(c, "name", None) == name]
        if "Process" in app.mq_class:
            ours = self.add(name, partial(child_process, target, name, CHANNELS[name][1], dict(spec=spec)))
        else:
            ours = Thread(target=target, kwargs=dict(spec=spec, in_process=False), name=name, daemon=True)
        app.children[app.children.index(stock)] = ours

    def launch_scheduler(self, name, scheduler_args, children, stock_launch):
        """ipyparallel's task scheduler, ours (``taskqueue``), supervised when in a process."""
        scheduler_args = dict(scheduler_args, scheduler_class=RestartableTaskScheduler)
        if "Process" not in self.app.mq_class or name not in CHANNELS:
            return stock_launch(name, scheduler_args, children)
        make = partial(child_process, launch_scheduler, name, CHANNELS[name][1], scheduler_args)
        children.append(self.add(name, make))
        return None

    def supervise_heart_monitor(self):
        """ipyparallel's heart monitor (ours: its pongs read once per beat,
        ``heart``), supervised; restarted knowing the hub's engines, so that
        one that died meanwhile is still found dead."""
        app = self.app
        kwargs = ipp.heart_monitor_kwargs(app)

        def make():
            known = dict(kwargs, hearts=set(app.hub.hearts))
            return child_process(start_heart_monitor, "HeartMonitor", "ipb-heart", known)

        app.heartmonitor_process = self.add("HeartMonitor", make)

    def start(self):
        """Before the controller starts: the notices socket, the checks, the keeper told."""
        app = self.app
        assert self.notices_port  # picked now if no connection file was written
        keepers = app.keepers
        facts = (lambda: keepers.facts) if keepers is not None else dict
        self.notices = Notices(app.session, app.client_url(P.NOTICES_KEY), app.bind, facts=facts)
        self.notices.start()
        PeriodicCallback(self.check, 250).start()
        say_up()  # (before its children start: they do not keep the keeper's pipe)

    def check(self):
        """Restart each child that exited (not at shutdown); tell the
        clients when it was a queue they sent through."""
        app = self.app
        for done in self.supervisor.check():
            child, old, new = done.child, done.old, done.new
            channel = CHANNELS.get(child.name, (None,))[0]
            if new is None:
                app.log.critical(
                    "%s exited (%s); restarted %d times, giving up (all in %g s)",
                    child.name,
                    old.exitcode,
                    app.node_restarts,
                    app.node_restart_window,
                )
            else:
                app.log.error(
                    "%s (pid %s) exited with code %s; restarted as pid %s", child.name, old.pid, old.exitcode, new.pid
                )
            if old in app.children:
                app.children[app.children.index(old)] = new or old
            if old is app.heartmonitor_process and new is not None:
                app.heartmonitor_process = new
            if channel is not None:
                content = dict(channel=channel, process=child.name, pid=old.pid, exitcode=old.exitcode)
                self.notices.publish(P.RESTARTED, dict(content, restarted=new is not None))

    def stop(self):
        """Before ipyparallel ends its children: none is restarted, the notices stop."""
        self.supervisor.stop()
        if self.notices is not None:
            self.notices.stop()

    def reap(self):
        """After: every child of ours joined, and shared memory left by a dead relay node removed."""
        for process in self.supervisor.processes():
            process.join(timeout=5)
        if self.app.shared_memory:  # segments of nodes that died mid-request (a stopped node removes its own)
            for name in sweep():
                self.app.log.info("removed %s, left by a relay node that is gone", name)
