"""Sending and receiving multipart messages on a zmq socket without pyzmq's
per-frame flag arithmetic (``zmq.SNDMORE | flags`` builds enums: pure Python
in 3.11, a tenth of a relay node's time and of an engine's reply)."""

from __future__ import annotations

import zmq
from tornado.log import gen_log
from zmq.eventloop.zmqstream import ZMQStream

_MORE, _NOBLOCK = int(zmq.SNDMORE), int(zmq.NOBLOCK)
_EVENTS, _POLLIN, _POLLOUT = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.POLLOUT)


def send_frames(sock: zmq.Socket, frames, copy: bool = False) -> None:
    """``sock.send_multipart(frames, copy=copy)``."""
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        sock.send(frame, _MORE if i < last else 0, copy=copy)


def recv_frames(sock: zmq.Socket) -> list:
    """``recv_multipart(NOBLOCK, copy=False)``, reading ``Frame.more`` instead
    of a socket option per frame; raises ``zmq.Again`` if nothing is there."""
    frames = [sock.recv(_NOBLOCK, copy=False)]
    while frames[-1].more:
        frames.append(sock.recv(0, copy=False))
    return frames


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
