"""The task queue (LoadBalancedView's scheduler), restartable.

ipyparallel's ``TaskScheduler`` asks the hub for the engines when it starts,
and sends tasks to them at once. A scheduler restarted after its process
died (``supervise``) binds the same ports, and the engines reconnect to it
within ZeroMQ's reconnect interval; a task sent to an engine before that
is dropped by its ROUTER socket, and waits forever. So this one counts the
engines' connections (a socket monitor's handshakes) and hands its engines
to the scheduling only when as many are connected as the hub has, or after
``hold`` seconds (an engine that died meanwhile never reconnects). Tasks
that come before are queued, as ipyparallel queues them with no engine.
A registration notice that comes before then (a new engine, or the hub's
replay of one it has: ``controller.roster``) joins the wait too.

An engine still not connected when the wait ends (paused, or slow to
reconnect on a loaded host) is scheduled on all the same, but its tasks are
not handed to a ROUTER that would drop them: sent with ``ROUTER_MANDATORY``,
a task its engine cannot take yet waits in that engine's outbox and goes
once it connects (the chaos runs found tasks lost so, after a controller
restart). An engine that leaves takes its outbox with it; ipyparallel fails
its tasks.
"""

from __future__ import annotations

import zmq
from traitlets import Float
from zmq.eventloop.zmqstream import ZMQStream
from zmq.utils.monitor import parse_monitor_message

from ..compat.ipp import TaskSchedulerSeam
from ..wire import protocol as P

RETRY = 0.1  # seconds between two tries of the outboxes


class RestartableTaskScheduler(TaskSchedulerSeam):
    hold = Float(2.0, config=True, help="Seconds a (re)started scheduler waits for its engines to reconnect.")
    _adding = False  # a batch of engines is leaving: queued tasks wait to be looked at again

    def start(self):
        self._outbox: dict[bytes, list] = {}  # engine -> tasks it could not take yet, in order
        self.engine_stream.socket.router_mandatory = 1  # a task for an engine not connected: told, not dropped
        self._connected = 0
        self._waiting: dict[bytes, None] | None = {}  # engines in order; None once released
        self._scheduled: set[bytes] = set()  # ``targets`` as a set (ipyparallel's is a list)
        self._queried = False  # the hub's engines known
        monitor = self.engine_stream.socket.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        self._monitor = ZMQStream(monitor, self.loop)
        self._monitor.on_recv(self._on_connection)
        send = self.session.send

        def lookup(stream, msg_type, content=None, *args, **kwargs):
            if msg_type == "connection_request":  # the hub is told: no client subscribes after this one
                content = {**(content or {}), P.TABLE_ONLY: True}  # (the scheduler subscribed before it)
            return send(stream, msg_type, content, *args, **kwargs)

        self.session.send = lookup  # for ipyparallel's start, which asks the hub for its engines
        try:
            super().start()
        finally:
            del self.session.send
        self.notifier_stream.socket.setsockopt(zmq.SUBSCRIBE, P.OURS_TOPIC)  # a host's engines: one batch

    def dispatch_notification(self, msg):
        """A host's engines registered (or gone) in one notification, added
        together (the queue looked at once); any other as ipyparallel's."""
        try:
            _, frames = self.session.feed_identities(msg)
            kind = self.session.unpack(frames[1]).get("msg_type")  # (the header; what is run is checked below)
        except (ValueError, IndexError, TypeError, AttributeError):
            kind = None
        if kind not in P.BATCH_NOTIFICATIONS:
            return super().dispatch_notification(msg)
        try:
            engines = self.session.deserialize(frames)["content"]["engines"]
            uids = [uuid.encode("utf8") for uuid in engines.values()]
        except (ValueError, KeyError, TypeError, AttributeError):
            self.log.warning("task: an invalid %s notification, dropped", kind)
            return None
        if kind == P.REGISTRATIONS:
            self._add_engines(uids)
            return self.update_graph(None)
        self._adding = True  # the queue looked at again once, after all
        try:
            for uid in uids:
                self._remove_engine(uid)
        finally:
            self._adding = False
        return self.update_graph(None)

    def _on_connection(self, frames):
        if parse_monitor_message(frames)["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self._connected += 1
            self._release_if_connected()

    def dispatch_query_reply(self, msg):
        """ipyparallel's, with its engines registered once they reconnected."""
        try:
            _, msg = self.session.feed_identities(msg)
            content = self.session.deserialize(msg)["content"]
        except (ValueError, KeyError, TypeError):
            self.log.warning("task: an invalid reply to the engines query, dropped")
            return
        self._add_engines([uuid.encode("utf8") for uuid in content.get("engines", {}).values()])
        self._queried = True
        self.loop.call_later(self.hold, self._release)
        self._release_if_connected()

    def _add_engine(self, uid):
        """ipyparallel's, once per engine, and only once released: before,
        the engine joins the wait (it may not have reconnected yet)."""
        if self._waiting is not None:
            self._waiting[uid] = None
        elif uid not in self._scheduled:
            self._scheduled.add(uid)
            super()._add_engine(uid)

    def _add_engines(self, uids):
        """ipyparallel's ``_register_engine`` for many engines at once (as ``_add_engine``
        does each): each new one at the head of the line, as there, but in one splice.
        One at a time, each insert moves every engine already there: O(N²) for a
        burst (seconds of the scheduler's CPU at 100,000 engines). The caller rescans the graph."""
        if self._waiting is not None:
            self._waiting.update(dict.fromkeys(uids))
            return
        new = [uid for uid in dict.fromkeys(uids) if uid not in self._scheduled]
        self._scheduled.update(new)
        self.targets[0:0] = new[::-1]
        self.loads[0:0] = [0] * len(new)
        for uid in new:
            self.completed[uid], self.failed[uid], self.pending[uid] = set(), set(), {}

    def _remove_engine(self, uid):
        """ipyparallel's; an engine that unregisters while this one waits is
        dropped from the wait (ipyparallel's would fail to find it, and the
        engine would then be scheduled though dead: its tasks lost). Then the
        queued tasks that only engines now gone could run fail (``_fail_stranded``)."""
        if self._waiting is not None:
            self._waiting.pop(uid, None)
            self._release_if_connected()
            return
        if uid not in self._scheduled:
            return None  # never scheduled here (ipyparallel's would fail to find it)
        self._scheduled.discard(uid)
        self._outbox.pop(uid, None)
        result = super()._remove_engine(uid)
        self._fail_stranded()
        return result

    def _fail_stranded(self):
        """Fail each queued task restricted to engines of which none is left.
        ipyparallel checks a queued task again only when some task ends and
        frees an engine; an unregistration checks nothing, so such a task
        could wait for good (a LoadBalancedView map to one engine, found by
        the chaos soak)."""
        live = set(self.targets)
        for job in list(self.queue):
            if job.msg_id in self.queue_map and self._stranded(job, live):
                self.fail_unreachable(job.msg_id)

    def _stranded(self, job, live: set) -> bool:
        """Whether ``job`` may run only on engines of which none is ``live`` (never
        while the engines are not known yet: a restarted scheduler's wait)."""
        if self._waiting is not None or not job.targets:
            return False
        return not (job.targets - job.blacklist) & live

    def save_unmet(self, job):
        """ipyparallel's; a task queued for engines already gone fails now.
        ipyparallel's ``maybe_run`` asks whether a task's engines are left only
        when some engine has room: a task read after its engine's unregistration
        (a relay that found the process gone told the hub before the client's
        send landed), while every other engine was busy, waited for good."""
        super().save_unmet(job)
        if job.targets and self._stranded(job, set(self.targets)):
            self.fail_unreachable(job.msg_id)

    def _release_if_connected(self):
        if self._queried and self._waiting is not None and self._connected >= len(self._waiting):
            self._release()

    def _release(self):
        waiting, self._waiting = self._waiting, None
        if waiting is None:
            return
        if self._connected < len(waiting):
            self.log.warning(
                "task: %d of %d engines reconnected in %g s; scheduling on all",
                self._connected,
                len(waiting),
                self.hold,
            )
        self._add_engines(waiting)  # every engine in before a queued task is looked at again: one
        self.update_graph(None)  # for an engine added later would fail as impossible (ImpossibleDependency)
        self.engine_stream.socket.disable_monitor()
        self._monitor.close()

    def update_graph(self, dep_id=None, success=True):
        """ipyparallel's, not while ``_release`` adds the engines one by one."""
        if not self._adding:
            return super().update_graph(dep_id, success)

    # ---------------------------------------------------------- delivery
    def submit_task(self, job, indices=None):
        """ipyparallel's (the least loaded engine of ``indices``, its load,
        its pending table, the hub told), the task delivered by ``_deliver``."""
        loads = [self.loads[i] for i in indices] if indices else self.loads
        idx = self.scheme(loads)
        if indices:
            idx = indices[idx]
        target = self.targets[idx]
        self._deliver(target, job.raw_msg)
        self.add_job(idx)
        self.pending[target][job.msg_id] = job
        content = dict(msg_id=job.msg_id, engine_id=target.decode("ascii"))
        self.session.send(self.mon_stream, "task_destination", content=content, ident=[b"tracktask", self.ident])

    def _deliver(self, target: bytes, frames):
        if target not in self._outbox and self._sent(target, frames):
            return
        if not self._outbox:
            self.loop.call_later(RETRY, self._retry)
        if target not in self._outbox:
            self.log.warning("task: engine %s is not connected to this scheduler yet; its tasks wait", target)
        self._outbox.setdefault(target, []).append(frames)

    def _sent(self, target: bytes, frames) -> bool:
        try:
            self.engine_stream.socket.send_multipart([target, *frames], zmq.NOBLOCK, copy=False)
        except zmq.ZMQError as e:
            if e.errno in (zmq.EHOSTUNREACH, zmq.EAGAIN):  # not connected (yet), or its queue full
                return False
            raise
        return True

    def _retry(self):
        for target, box in list(self._outbox.items()):
            while box and self._sent(target, box[0]):
                box.pop(0)
            if not box:
                del self._outbox[target]
                self.log.info("task: engine %s connected; its waiting tasks sent", target)
        if self._outbox:
            self.loop.call_later(RETRY, self._retry)
