"""What the client does when a part of the controller dies.

The controller restarts a child process that died and says so on its
notices socket (``controller.notices``). A broadcast in flight when the whole
controller restarted (its beats come from a new pid) is sent again: the engines
answer it with the replies they kept (``ReplyFiling.again``). What went
through a dead queue of IPython Parallel's is lost: the client fails its requests through that queue at once, per
engine, naming it (``EngineError: the controller's mux queue died (pid 123):
engine 3 did not answer``); a reply that comes later anyway is dropped, so
each request ends once. After the IOPub relay died, outputs owed for
replies already in are closed, with a note. The controller also beats once
a second: with requests outstanding and no beat for ``controller_timeout``
seconds, every one of them fails, naming the controller, whose hub died or
cannot be reached.

On a controller that has no notices socket (IPython Parallel's own), or
through an ssh tunnel, none of this runs.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict

import zmq
from ipyparallel import util
from tornado.ioloop import PeriodicCallback
from zmq.eventloop.zmqstream import ZMQStream

from ..wire import protocol as P
from .connect import BeatWatch, connect_patiently
from .guard import contained, guarded_callback

log = logging.getLogger(__name__)
GIVEN_UP_KEPT = 4096  # ids of requests failed early, whose late replies are dropped


class ControllerWatch:
    """A part of our Client: the controller's notices, and its beats. It owns
    what it watches; ``client`` is the Client it serves (its sockets, loop,
    session and ipyparallel's tables, read through the seam; the calls it
    fails go through the client's replies, ``ReplyFiling.root_lost``)."""

    def __init__(self, client):
        self.client = client
        self.via: dict[str, tuple[str, str | None]] = {}  # msg_id -> (channel, engine uuid), while outstanding
        self.given_up: OrderedDict[str, None] = OrderedDict()
        self.last_beat: float | None = None  # None: no notices socket
        self.last_tick = 0.0  # when the watch last ran (a stalled I/O thread is not a silent controller)
        self.silent = False  # it was, for controller_timeout: it is taken for dead
        self.pid: int | None = None  # its main process, as its beats say
        self.keeper: int | None | bool = False  # the process keeping it, as they say (None: none; False: not said)
        self.notices: ZMQStream | None = None

    def _port(self):
        """The notices socket's port, or None (a stock controller, or through an
        ssh tunnel: no tunnel is made for it, and its silence would fail every call)."""
        client = self.client
        return None if client._tunneled else client._connection_info.get(P.NOTICES_KEY)

    # ----------------------------------------------------------- the socket
    def connect(self, upstream, sshserver, ssh_kwargs, timeout):
        """ipyparallel's ``upstream`` connect, asking again a controller restarted meanwhile (``connect``)."""
        client, port = self.client, self._port()
        if port is None:
            return upstream(sshserver, ssh_kwargs, timeout)
        keys = dict(
            curve_serverkey=client.curve_serverkey,
            curve_secretkey=client.curve_secretkey,
            curve_publickey=client.curve_publickey,
        )
        url = f"{client._connection_info['interface']}:{port}"
        watch = BeatWatch(client._zmq_context, url, client.session, keys)
        try:
            connect_patiently(
                lambda seconds: upstream(sshserver, ssh_kwargs, seconds),
                client._query_sock,
                watch,
                timeout,
                reset=lambda: setattr(client, "_is_connected", False),
            )
        finally:
            watch.close()

    def open(self):
        """I/O thread, before its loop runs: the notices socket, and the watch."""
        client, port = self.client, self._port()
        if port is None:
            return
        sock = client._zmq_context.socket(zmq.SUB)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.linger = 0
        util.connect(
            sock,
            f"{client._connection_info['interface']}:{port}",
            curve_serverkey=client.curve_serverkey,
            curve_secretkey=client.curve_secretkey,
            curve_publickey=client.curve_publickey,
        )
        self.notices = ZMQStream(sock, client._loop)
        self.notices.on_recv(contained(self.on_notice, client.session, "notices"), copy=False)
        self.last_beat = self.last_tick = time.monotonic()
        watch = PeriodicCallback(guarded_callback(self.check, "controller watch"), 1000)
        client._loop.add_callback(watch.start)

    def closing(self, linger):
        """The client closes: the notices socket goes, and its sockets' linger
        is none once the controller was found silent (what is queued for it
        will never go, and a socket that lingers on it would hang its
        context's ``term()``, and a later ``destroy()``, for good)."""
        if self.notices is not None and not self.notices.closed():
            self.client._loop.add_callback(self.notices.close)
        return 0 if linger is None and self.silent else linger

    def on_notice(self, frames):
        session = self.client.session
        try:
            _, body = session.feed_identities(frames, copy=False)
            msg = session.deserialize(body, content=True, copy=False)
        except Exception as e:  # unsigned, forged or garbled
            log.error("Dropped an invalid notice from the controller: %s", e)
            return
        self.last_beat = time.monotonic()  # any notice is a sign of life
        self.silent = False
        kind = msg["header"]["msg_type"]
        if kind == P.RESTARTED:
            self.child_died(msg["content"])
        elif kind == P.BEAT and isinstance(msg["content"].get("pid"), int):
            self.beat_from(msg["content"]["pid"])
            if "keeper" in msg["content"]:
                self.keeper = msg["content"]["keeper"]

    def beat_from(self, pid: int):
        """A beat of the controller's process ``pid``: another than before is
        the controller restarted (its launcher's ``--restore``). What was owed
        through the dead one cannot come back: it fails now, named."""
        before, self.pid = self.pid, pid
        if before is None or before == pid:
            return
        log.warning("The controller restarted (pid %s died; now pid %s): its engines are kept", before, pid)
        why = f"the controller died (pid {before}) with it in flight, and was restarted"
        client = self.client
        self.fail(list(self.via), why)  # through IPython Parallel's queues: lost with them
        client._replies.root_lost(client._root_watch.lose_all(why))  # broadcasts: sent again
        client._iopub_liveness.close_owed(why)  # its IOPub relay died with it

    # -------------------------------------------------------- what is owed
    def sent(self, socket, future, ident):
        """A request through a queue is remembered until it ends, with its
        engine, to be failed if that queue dies."""
        if future is None or self.last_beat is None:
            return
        client = self.client
        channel = {
            id(client._direct_stream): "mux",
            id(client._balanced_stream): "task",
            id(client._control_channel): "control",
        }.get(id(socket))
        if channel is not None:
            msg_id = future.msg_id
            uuid = (ident[-1] if isinstance(ident, list) else ident).decode("utf-8") if ident else None
            self.via[msg_id] = (channel, uuid)
            future.add_done_callback(lambda _: self.via.pop(msg_id, None))  # (at once if done already)

    def child_died(self, content: dict):
        channel, pid = content.get("channel"), content.get("pid")
        again = "; it was restarted" if content.get("restarted") else "; it was not restarted"
        if channel == "iopub":
            self.client._iopub_liveness.close_owed(f"the controller's IOPub relay died (pid {pid}) with it in flight")
            return
        owed = [m for m, (c, _) in list(self.via.items()) if c == channel]
        if owed:
            log.error(
                "the controller's %s queue died (pid %s)%s: failing %d request(s)", channel, pid, again, len(owed)
            )
        self.fail(owed, f"the controller's {channel} queue died (pid {pid})")

    def check(self):
        """I/O thread, each second: no beat for ``controller_timeout`` fails all that is owed."""
        timeout, last, now = self.client.controller_timeout, self.last_beat, time.monotonic()
        if not timeout or last is None or self.notices.closed():  # (closed: the client is closing)
            return
        stalled, self.last_tick = now - self.last_tick > 2.0, now
        if stalled or self.notices.socket.poll(0):  # this thread was busy, or a notice waits to be read
            self.last_beat = now
            return
        if now - last < timeout:
            return
        self.last_beat = time.monotonic()  # once per silence of that length
        self.silent = True
        silent = f"the controller sent no sign of life for {timeout:g} s (its hub died, or cannot be reached)"
        self.fail_everything(silent)

    def fail_everything(self, why: str):
        """Every request through the controller, and every call, fails: ``why``."""
        client = self.client
        owed, calls = list(self.via), list(client._root_watch.in_flight)
        if owed or calls:
            log.error("%s: failing %d request(s)", why, len(owed) + len(calls))
        self.fail(owed, why)
        client._replies.root_lost([(msg_id, why) for msg_id in calls], again=False)

    def fail(self, msg_ids, why: str):
        client = self.client
        for msg_id in msg_ids:
            channel, uuid = self.via.pop(msg_id, (None, None))
            if msg_id in client.results:
                continue
            eid = client._engine_table.get(uuid) if uuid else None
            whom = f"engine {eid if eid is not None else uuid} did not answer" if uuid else "no engine answered"
            msg = client._engine_error_reply(msg_id, uuid, f"{why}: {whom}")
            self.given_up[msg_id] = None
            while len(self.given_up) > GIVEN_UP_KEPT:
                self.given_up.popitem(last=False)
            if channel == "control":
                future = client._reply_futures.get(msg_id)
                if future is not None and not future.done():
                    future.set_result(msg)
            elif msg_id in client.outstanding:
                client._file_apply_reply(msg)

    def unless_given_up(self, handler):
        """A reply handler that drops the late reply of a request already
        ended: failed early here, or failed when its engine unregistered
        (ipyparallel prints such a "stale result", files it over the first
        outcome, and sets its future twice)."""
        client = self.client

        def handle(frames):
            msg_id = client._parent_id(frames)
            if msg_id in self.given_up or (msg_id not in client.outstanding and msg_id in client.results):
                log.debug("dropped the late reply to %s, which had ended", msg_id)
                return
            return handler(frames)

        return handle
