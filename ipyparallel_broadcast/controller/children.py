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

from ipyparallel.controller.heartmonitor import start_heartmonitor
from ipyparallel.controller.scheduler import launch_scheduler
from tornado.ioloop import PeriodicCallback

from ..compat import ipp
from ..host.shm import sweep
from ..wire import protocol as P
from .notices import Notices
from .restarts import say_up
from .supervise import child_process
from .taskqueue import RestartableTaskScheduler

# the queues' process names, and the client channel each carries (its clients are told when it dies)
CHANNELS = {
    "DirectScheduler": ("mux", "ipb-mux"),
    "ControlScheduler": ("control", "ipb-control"),
    "TaskScheduler": ("task", "ipb-task"),
    "IOPubScheduler": ("iopub", "ipb-iopub"),
}


class ChildSupervision:
    """Mixin of ``BroadcastController`` (an ``IPController``): its children
    supervised (``self.supervisor``, made in ``init_hub``), its clients told
    (``notices``)."""

    @property
    def notices_port(self):
        """The port of the clients' notices socket (``notices``), picked once."""
        if P.NOTICES_KEY not in self.client_info:
            self.client_info[P.NOTICES_KEY] = self.next_port("client")
        return self.client_info[P.NOTICES_KEY]

    def _replace_queue(self, name: str, target, spec: dict):
        (stock,) = [c for c in self.children if getattr(c, "name", None) == name]
        if "Process" in self.mq_class:
            make = partial(child_process, target, name, CHANNELS[name][1], dict(spec=spec))
            ours = self.supervisor.add(name, make).process
        else:
            ours = Thread(target=target, kwargs=dict(spec=spec, in_process=False), name=name, daemon=True)
        self.children[self.children.index(stock)] = ours

    def launch_python_scheduler(self, name, scheduler_args, children):
        """ipyparallel's task scheduler, ours (``taskqueue``), supervised when in a process."""
        scheduler_args = dict(scheduler_args, scheduler_class=RestartableTaskScheduler)
        if "Process" not in self.mq_class or name not in CHANNELS:
            return super().launch_python_scheduler(name, scheduler_args, children)
        make = partial(child_process, launch_scheduler, name, CHANNELS[name][1], scheduler_args)
        children.append(self.supervisor.add(name, make).process)

    def _supervise_heart_monitor(self):
        """ipyparallel's heart monitor, supervised; restarted knowing the
        hub's engines, so that one that died meanwhile is still found dead."""
        kwargs = ipp.heart_monitor_kwargs(self)

        def make():
            known = dict(kwargs, hearts=set(self.hub.hearts))
            return child_process(start_heartmonitor, "HeartMonitor", "ipb-heart", known)

        self.heartmonitor_process = self.supervisor.add("HeartMonitor", make).process

    def start(self):
        assert self.notices_port  # picked now if no connection file was written
        self.notices = Notices(self.session, self.client_url(P.NOTICES_KEY), self.bind)
        self.notices.start()
        PeriodicCallback(self.supervise, 250).start()
        say_up()  # (before its children start: they do not keep the keeper's pipe)
        super().start()

    def supervise(self):
        """Restart each child that exited (not at shutdown); tell the
        clients when it was a queue they sent through."""
        for done in self.supervisor.check():
            child, old, new = done.child, done.old, done.new
            channel = CHANNELS.get(child.name, (None,))[0]
            if new is None:
                self.log.critical(
                    "%s exited (%s); restarted %d times, giving up (all in %g s)",
                    child.name,
                    old.exitcode,
                    self.node_restarts,
                    self.node_restart_window,
                )
            else:
                self.log.error(
                    "%s (pid %s) exited with code %s; restarted as pid %s", child.name, old.pid, old.exitcode, new.pid
                )
            if old in self.children:
                self.children[self.children.index(old)] = new or old
            if old is self.heartmonitor_process and new is not None:
                self.heartmonitor_process = new
            if channel is not None:
                content = dict(channel=channel, process=child.name, pid=old.pid, exitcode=old.exitcode)
                self.notices.publish(P.RESTARTED, dict(content, restarted=new is not None))

    def terminate_children(self):
        supervisor = getattr(self, "supervisor", None)
        if supervisor is not None:
            supervisor.stop()
        if getattr(self, "notices", None) is not None:
            self.notices.stop()
        super().terminate_children()
        for process in supervisor.processes() if supervisor is not None else ():
            process.join(timeout=5)
        if self.shared_memory:  # segments of nodes that died mid-request (a stopped node removes its own)
            for name in sweep():
                self.log.info("removed %s, left by a relay node that is gone", name)
