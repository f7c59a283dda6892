"""The seam to pyzmq: every use of a private member of pyzmq is here.

``ZMQStream``'s internals, for the engine's lean reply path:
- ``_handle_events``, ``_recv_copy``, ``_recv_callback``, ``_flushed``,
  ``_run_callback``, ``_handle_send``, ``_rebuild_io_state``: ``LeanStream``
  overrides the event handler to read frames with int flags, and must do what
  the stock handler does around the read;
- ``_update_handler``: the stock one re-reads ``EVENTS`` through the enum path;
- ``_init_io_state`` and ``__class__``: ``lean()`` swaps a live stream's class
  and registers its handler again (the loop holds the old bound method).

Checked against pyzmq 27.3.0 (the suite).
"""

from __future__ import annotations

import zmq
from tornado.log import gen_log
from zmq.eventloop.zmqstream import ZMQStream

from ..wire.frames import recv_frames, send_frames

_EVENTS, _POLLIN, _POLLOUT = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.POLLOUT)


class Direct:
    """A ZMQStream's socket as ``Session.send`` sees it: sent at once, in this
    thread (no send queue, with its extra event-loop turn), by ``send_frames``.
    Only for the thread that runs the stream's loop.

    zmq's descriptor is edge-triggered, and a send may take the wakeup of a
    message that arrived meanwhile; the stream would then never read it. So
    if anything is pending after the send, the stream looks again
    (``flush``, on the loop's next turn)."""

    __slots__ = ("stream", "socket")

    def __init__(self, stream):
        self.stream, self.socket = stream, getattr(stream, "socket", stream)

    def send_multipart(self, frames, copy: bool = True, **_):
        send_frames(self.socket, frames, copy=copy)
        if self.socket is not self.stream and self.socket.getsockopt(_EVENTS) & _POLLIN:
            self.stream.io_loop.add_callback(self.stream.flush)


class LeanStream(ZMQStream):
    """A ZMQStream that reads its events and frames with int flags
    (``recv_frames``): pyzmq's reads enum-valued socket options per event and
    per frame, and ``EVENTS`` twice per message. Made by ``lean(stream)``, in
    place, on a stream that receives with ``copy=False``; anything unusual (a
    closed socket, an error) goes to ZMQStream's own handling."""

    def _handle_events(self, fd, events):
        sock = self.socket
        if not sock or self._recv_copy:
            return super()._handle_events(fd, events)
        try:
            zmq_events = sock.getsockopt(_EVENTS)
        except zmq.ZMQError:
            return super()._handle_events(fd, events)
        try:
            if zmq_events & _POLLIN and self._recv_callback and not self._flushed:
                try:
                    frames = recv_frames(sock)
                except zmq.Again:
                    pass
                else:
                    self._run_callback(self._recv_callback, frames)
                if not self.socket:
                    return
            if zmq_events & _POLLOUT and self.sending():
                self._handle_send()
                if not self.socket:
                    return
            self._rebuild_io_state()
        except Exception:
            gen_log.error("Uncaught exception in zmqstream callback", exc_info=True)
            raise

    def _update_handler(self, state):
        if self.socket is not None and state & self.socket.getsockopt(_EVENTS):
            self.io_loop.add_callback(lambda: self._handle_events(self.socket, 0))


def lean(stream: ZMQStream) -> ZMQStream:
    """``stream``, reading as a ``LeanStream`` from now on: its class swapped
    (LeanStream only overrides methods), and its socket's handler registered
    again (the loop holds the old class's bound method)."""
    if type(stream) is ZMQStream and stream.socket is not None:
        stream.__class__ = LeanStream
        stream.io_loop.remove_handler(stream.socket)
        stream._init_io_state()
    return stream
