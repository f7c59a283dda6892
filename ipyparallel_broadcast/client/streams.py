"""How the client's sockets are read: ipyparallel's streams, each handler
``contained`` (an exception is logged with its message and never stops a
stream), a reply or output that cannot be handled failing only its own
request, and each engine's output of a broadcast routed to that engine's part.

The broadcast socket is read by ``rootsocket.RootSocket`` (every message
waiting per wakeup, sends at once), the others by ipyparallel's streams.
A mixin of ``upstream.Upstream`` (an ``ipyparallel.Client``), on the client's
I/O thread.
"""

from __future__ import annotations

import logging

from tornado.ioloop import PeriodicCallback

from ..compat import ipp
from ..wire import protocol as P
from ..wire.naming import engine_of_topic, is_broadcast_id
from .guard import contained, guarded_callback
from .replies import RootWatch
from .results import outcome_metadata
from .rootsocket import RootSocket

log = logging.getLogger(__name__)


class StreamReaders:
    """The reading side of ``Upstream``: set up on the I/O thread, before its loop runs."""

    def _open_streams(self):
        """IO thread, before its loop runs: the parent's streams and our
        broadcast socket, each read by a ``contained`` handler (an exception is
        logged, never stops a stream)."""
        self._codec = P.Codec(self.session)
        self._root_watch = RootWatch(self.root_ping_interval, self.root_timeout)
        super()._open_streams()
        stock = self._root_stream  # ipyparallel's ZMQStream: off the loop, its socket read by ours
        self._loop.remove_handler(stock.socket)
        self._root_stream = RootSocket(stock.socket, self._loop)
        streams = ipp.client_streams(self)  # {what: (stream, ipyparallel's handler)}
        streams["IOPub"] = (streams["IOPub"][0], self._read_iopub)
        streams["broadcast"] = (self._root_stream, self._dispatch_broadcast)
        for what in ("control", "mux", "task"):  # a request failed early (its queue died): its late reply is dropped
            streams[what] = (streams[what][0], self._watch.unless_given_up(streams[what][1]))
        on_error = dict(control=self._reply_failed, mux=self._reply_failed, task=self._reply_failed)
        on_error["IOPub"] = self._iopub_failed
        for what, (stream, handler) in streams.items():
            stream.on_recv(contained(handler, self.session, what, on_error.get(what)), copy=False)
        self._root_stream.on_send(guarded_callback(self._broadcast_sent, "broadcast send"))
        pings = PeriodicCallback(
            guarded_callback(self._replies.watch_root, "root watch"), self.root_ping_interval * 1e3, jitter=0.1
        )
        self._loop.add_callback(pings.start)  # on this loop, once it runs
        self._loop.add_callback(self._heap_trims.schedule)  # on this loop, once it runs

    def _parent_id(self, frames):
        """The msg_id a raw message answers, or None if it cannot be read."""
        try:
            body = P.split_idents(frames)[1]
            return (self.session.unpack(P.as_bytes(body[2])) or {}).get("msg_id")
        except Exception:
            return None

    def _reply_failed(self, frames, exc):
        """A reply that could not be handled fails its own request, at once."""
        msg_id = self._parent_id(frames)
        future = self._reply_futures.get(msg_id)
        if future is not None and not future.done():  # an error result, as ipyparallel's
            failure = RuntimeError(f"the client could not handle the reply: {exc!r}")
            self.results[msg_id] = failure
            self.outstanding.discard(msg_id)
            future.set_result(failure)
        output = self._iopub_futures.get(msg_id)
        if output is not None and not output.done():
            output.set_result(None)

    def _iopub_failed(self, frames, exc):
        """An IOPub message that could not be handled is dropped; if it was the
        ``status`` that ends a request's output, that output is complete."""
        try:
            idents, body = P.split_idents(frames)
            header, parent, metadata = (self.session.unpack(P.as_bytes(b)) for b in body[1:4])
        except Exception:
            return
        if header.get("msg_type") != "status":
            return
        msg_id = (parent or {}).get("msg_id")
        call = self._calls.get(msg_id)
        if call is not None:  # one engine's part of a broadcast
            i = call.engine_index((metadata or {}).get("engine"), engine_of_topic(idents))
            if i is not None:
                self._replies.output_done(call, i)
            return
        output = self._iopub_futures.get(msg_id)
        if output is not None and not output.done():
            output.set_result(None)

    def _read_iopub(self, frames):
        """Route an engine's output for a broadcast to that engine's part."""
        try:
            idents, body = self.session.feed_identities(frames, copy=False)
            msg = self.session.deserialize(body, content=True, copy=False)
        except Exception as e:
            log.error("Dropped an invalid IOPub message: %s", e)
            return
        parent = msg["parent_header"]
        msg_id = parent.get("msg_id") if parent else None
        call = self._calls.get(msg_id) if msg_id else None
        if call is not None:
            # by the call's own engines: the client may have forgotten this one
            # (it died after it answered, and its unregistration came first)
            i = call.engine_index(msg["metadata"].get("engine"), engine_of_topic(idents))
            if i is None:
                return
            if msg["header"]["msg_type"] == "status":
                if msg["content"].get("execution_state") == "idle":
                    self._replies.output_done(call, i)
                return
            outcome_metadata(self, call, i)  # ipyparallel's handler below fills it
            msg["parent_header"] = dict(parent, msg_id=call.vids[i])
        elif (
            is_broadcast_id(msg_id)
            and msg_id not in self._reductions
            and not msg["header"]["msg_type"].startswith("comm_")
        ):
            return  # output of a finished broadcast (e.g. a thread printing late)
        return ipp.upstream_iopub(self, msg)
