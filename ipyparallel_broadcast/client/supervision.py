"""What the client does when a part of the controller dies.

The controller restarts a child process that died and says so on its
notices socket (``controller.notices``). What went through a dead queue is
lost: the client fails its requests through that queue at once, per
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
from traitlets import Float
from zmq.eventloop.zmqstream import ZMQStream

from ..compat.ipp import ClientSeam
from ..wire import protocol as P
from .connect import BeatWatch, connect_patiently
from .guard import contained, guarded_callback

log = logging.getLogger(__name__)
GIVEN_UP_KEPT = 4096  # ids of requests failed early, whose late replies are dropped


class ControllerWatch(ClientSeam):
    """Mixin of our Client: the controller's notices, and its beats."""

    controller_timeout = Float(
        10.0,
        config=True,
        help="Seconds without a beat from the controller after which the client's outstanding "
        "requests fail, naming it (its hub died). 0: never.",
    )

    def __init__(self, *args, **kwargs):
        self._via: dict[str, tuple[str, str | None]] = {}  # msg_id -> (channel, engine uuid), while outstanding
        self._given_up: OrderedDict[str, None] = OrderedDict()
        self._last_beat: float | None = None  # None: no notices socket
        self._last_tick = 0.0  # when the watch last ran (a stalled I/O thread is not a silent controller)
        self._controller_silent = False  # it was, for controller_timeout: it is taken for dead
        self._controller_pid: int | None = None  # its main process, as its beats say
        self._notices: ZMQStream | None = None
        super().__init__(*args, **kwargs)

    # ----------------------------------------------------------- the socket
    def _connect_to_hub(self, sshserver, ssh_kwargs, timeout):
        """ipyparallel's, asking again a controller restarted meanwhile (``connect``)."""
        port = self._connection_info.get(P.NOTICES_KEY)
        if port is None or self._tunneled:
            return super()._connect_to_hub(sshserver, ssh_kwargs, timeout)
        keys = dict(
            curve_serverkey=self.curve_serverkey,
            curve_secretkey=self.curve_secretkey,
            curve_publickey=self.curve_publickey,
        )
        url = f"{self._connection_info['interface']}:{port}"
        watch = BeatWatch(self._zmq_context, url, self.session, keys)
        upstream = super()._connect_to_hub
        try:
            connect_patiently(
                lambda seconds: upstream(sshserver, ssh_kwargs, seconds),
                self._query_sock,
                watch,
                timeout,
                reset=lambda: setattr(self, "_is_connected", False),
            )
        finally:
            watch.close()

    def _open_streams(self):
        super()._open_streams()
        port = self._connection_info.get(P.NOTICES_KEY)
        if port is None or self._tunneled:  # (no tunnel is made for it: its silence would fail every call)
            return
        sock = self._zmq_context.socket(zmq.SUB)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.linger = 0
        util.connect(
            sock,
            f"{self._connection_info['interface']}:{port}",
            curve_serverkey=self.curve_serverkey,
            curve_secretkey=self.curve_secretkey,
            curve_publickey=self.curve_publickey,
        )
        self._notices = ZMQStream(sock, self._loop)
        self._notices.on_recv(contained(self._on_notice, self.session, "notices"), copy=False)
        self._last_beat = self._last_tick = time.monotonic()
        watch = PeriodicCallback(guarded_callback(self._watch_controller, "controller watch"), 1000)
        self._loop.add_callback(watch.start)

    def close(self, linger=None):
        """ipyparallel's; once the controller was found silent, with no linger:
        what is queued for it will never go, and a socket that lingers on it
        would hang its context's ``term()`` (and a later ``destroy()``) for good."""
        if self._notices is not None and not self._notices.closed():
            self._loop.add_callback(self._notices.close)
        super().close(0 if linger is None and self._controller_silent else linger)

    def _on_notice(self, frames):
        try:
            _, body = self.session.feed_identities(frames, copy=False)
            msg = self.session.deserialize(body, content=True, copy=False)
        except Exception as e:  # unsigned, forged or garbled
            log.error("Dropped an invalid notice from the controller: %s", e)
            return
        self._last_beat = time.monotonic()  # any notice is a sign of life
        self._controller_silent = False
        kind = msg["header"]["msg_type"]
        if kind == P.RESTARTED:
            self._child_died(msg["content"])
        elif kind == P.BEAT and isinstance(msg["content"].get("pid"), int):
            self._beat_from(msg["content"]["pid"])

    def _beat_from(self, pid: int):
        """A beat of the controller's process ``pid``: another than before is
        the controller restarted (its launcher's ``--restore``). What was owed
        through the dead one cannot come back: it fails now, named."""
        before, self._controller_pid = self._controller_pid, pid
        if before is None or before == pid:
            return
        log.warning("The controller restarted (pid %s died; now pid %s): its engines are kept", before, pid)
        why = f"the controller died (pid {before}) with it in flight, and was restarted"
        self._fail_everything(why)
        for _, close in list(self._owed_outputs()):  # its IOPub relay died with it
            close(why)

    # -------------------------------------------------------- what is owed
    def _send_message(self, socket, msg_type, *args, ident=None, **kwargs):
        """ipyparallel's send; a request through a queue is remembered until
        it ends, with its engine, to be failed if that queue dies."""
        future = super()._send_message(socket, msg_type, *args, ident=ident, **kwargs)
        if future is None or self._last_beat is None:
            return future
        channel = {
            id(self._direct_stream): "mux",
            id(self._balanced_stream): "task",
            id(self._control_channel): "control",
        }.get(id(socket))
        if channel is not None:
            msg_id = future.msg_id
            uuid = (ident[-1] if isinstance(ident, list) else ident).decode("utf-8") if ident else None
            self._via[msg_id] = (channel, uuid)
            future.add_done_callback(lambda _: self._via.pop(msg_id, None))  # (at once if done already)
        return future

    def _child_died(self, content: dict):
        channel, pid = content.get("channel"), content.get("pid")
        again = "; it was restarted" if content.get("restarted") else "; it was not restarted"
        if channel == "iopub":
            why = f"the controller's IOPub relay died (pid {pid}) with it in flight"
            for _, close in list(self._owed_outputs()):
                close(why)
            return
        owed = [m for m, (c, _) in list(self._via.items()) if c == channel]
        if owed:
            log.error(
                "the controller's %s queue died (pid %s)%s: failing %d request(s)", channel, pid, again, len(owed)
            )
        self._fail(owed, f"the controller's {channel} queue died (pid {pid})")

    def _watch_controller(self):
        """I/O thread, each second: no beat for ``controller_timeout`` fails all that is owed."""
        timeout, last, now = self.controller_timeout, self._last_beat, time.monotonic()
        if not timeout or last is None or self._notices.closed():  # (closed: the client is closing)
            return
        stalled, self._last_tick = now - self._last_tick > 2.0, now
        if stalled or self._notices.socket.poll(0):  # this thread was busy, or a notice waits to be read
            self._last_beat = now
            return
        if now - last < timeout:
            return
        self._last_beat = time.monotonic()  # once per silence of that length
        self._controller_silent = True
        silent = f"the controller sent no sign of life for {timeout:g} s (its hub died, or cannot be reached)"
        self._fail_everything(silent)

    def _fail_everything(self, why: str):
        """Every request through the controller, and every call, fails: ``why``."""
        owed, calls = list(self._via), list(self._root_watch.in_flight)
        if owed or calls:
            log.error("%s: failing %d request(s)", why, len(owed) + len(calls))
        self._fail(owed, why)
        for msg_id in calls:
            self._root_watch.done(msg_id)
        self._root_lost([(msg_id, why) for msg_id in calls])

    def _fail(self, msg_ids, why: str):
        for msg_id in msg_ids:
            channel, uuid = self._via.pop(msg_id, (None, None))
            if msg_id in self.results:
                continue
            eid = self._engine_table.get(uuid) if uuid else None
            whom = f"engine {eid if eid is not None else uuid} did not answer" if uuid else "no engine answered"
            msg = self._engine_error_reply(msg_id, uuid, f"{why}: {whom}")
            self._given_up[msg_id] = None
            while len(self._given_up) > GIVEN_UP_KEPT:
                self._given_up.popitem(last=False)
            if channel == "control":
                future = self._reply_futures.get(msg_id)
                if future is not None and not future.done():
                    future.set_result(msg)
            elif msg_id in self.outstanding:
                self._file_apply_reply(msg)

    def _unless_given_up(self, handler):
        """A reply handler that drops the late reply of a request already
        ended: failed early here, or failed when its engine unregistered
        (ipyparallel prints such a "stale result", files it over the first
        outcome, and sets its future twice)."""

        def handle(frames):
            msg_id = self._parent_id(frames)
            if msg_id in self._given_up or (msg_id not in self.outstanding and msg_id in self.results):
                log.debug("dropped the late reply to %s, which had ended", msg_id)
                return
            return handler(frames)

        return handle
