"""The client's broadcast socket, read by a loop of its own.

ipyparallel reads every socket through a ``ZMQStream``: one message per
event-loop turn, each read followed by two ``EVENTS`` queries (through enum
arithmetic) and a scheduled callback to look for the next one, and every send
queued for a later turn. On the broadcast socket, where a streamed call brings
a message per engine or per batch (about 170 per call at 1,024 engines),
``RootSocket`` replaces it: each wakeup reads every message waiting (up to
``DRAIN``, then the loop's other work has its turn) and sends go out at once,
from the I/O thread that owns the socket. The other sockets keep their streams.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

import zmq

from ..wire.frames import recv_frames

log = logging.getLogger(__name__)

_EVENTS, _POLLIN, _POLLOUT = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.POLLOUT)
_NOBLOCK = int(zmq.NOBLOCK)
DRAIN = 256  # messages read per wakeup at most


class RootSocket:
    """The broadcast socket on the client's I/O loop; every method runs on that
    loop's thread. ``on_recv(handler)``: ``handler(frames)`` per message, frames
    not copied; it must not raise (``guard.contained``). ``on_send(callback)``:
    ``callback(frames, tracker)`` once a message is handed to zmq (``tracker``:
    its ``MessageTracker`` if sent with ``track``, else None). An exception
    out of either is logged, and the socket reads on.

    zmq's descriptor is edge-triggered: it fires when the socket's state
    changes, and a send may consume the change a message's arrival made. So
    each wakeup reads until zmq says there is nothing (``Again``), and each
    send looks again and reads on the next turn if something is waiting."""

    def __init__(self, socket: zmq.Socket, io_loop):
        self.socket, self.io_loop = socket, io_loop
        self._handler: Callable | None = None
        self._sent: Callable | None = None
        self._waiting: deque = deque()  # sends zmq could not take yet (high-water mark)
        self.wakeups = self.received = 0  # reads (wakeups with a handler) and messages read
        io_loop.add_handler(socket, self._ready, io_loop.READ)  # (reads nothing until on_recv)

    def on_recv(self, handler: Callable, copy: bool = False):
        if copy:
            raise ValueError("the broadcast socket is read without copying")
        self._handler = handler
        self.io_loop.add_callback(self._ready)  # what came before there was a handler

    def on_send(self, callback: Callable):
        self._sent = callback

    def send_multipart(self, frames, copy: bool = True, track: bool = False):
        """Send now, or once zmq can take it (in order, after the ones waiting)."""
        if self._waiting or not self._send(frames, copy, track):
            self._waiting.append((frames, copy, track))
        self._look_again()

    def _send(self, frames, copy, track) -> bool:
        """True if zmq took the message (False: its queue is full, try later)."""
        try:
            tracker = self.socket.send_multipart(frames, _NOBLOCK, copy=copy, track=track)
        except zmq.Again:
            return False
        except zmq.ZMQError as e:
            log.error("broadcast socket: send failed: %s", e)
            tracker = None
        if self._sent is not None:
            try:
                self._sent(frames, tracker)
            except Exception:
                log.error("broadcast socket: send callback failed", exc_info=True)
        return True

    def _look_again(self):
        """After a send: read on the next turn if anything is waiting (the send
        may have taken the descriptor's wakeup)."""
        try:
            events = self.socket.getsockopt(_EVENTS)
        except zmq.ZMQError:
            return
        if (events & _POLLIN and self._handler is not None) or (self._waiting and events & _POLLOUT):
            self.io_loop.add_callback(self._ready)

    def _ready(self, fd=None, events=None):
        """The descriptor fired (or a send looked again): send what waits, then
        read every message there is, up to ``DRAIN``."""
        sock = self.socket
        if sock is None or sock.closed:
            return
        while self._waiting and self._send(*self._waiting[0]):
            self._waiting.popleft()
        handler = self._handler
        if handler is None:  # not reading yet
            return self._look_again()  # (takes zmq's wakeup, which would fire again and again)
        self.wakeups += 1
        for _ in range(DRAIN):
            try:
                frames = recv_frames(sock)
            except zmq.Again:  # (one per wakeup: asking EVENTS per message cost more when many came)
                if self._waiting:
                    self._look_again()  # the read may have let them go
                return
            except zmq.ZMQError as e:  # closed under us, or the context terminated
                log.warning("broadcast socket: reading stopped: %s", e)
                return
            self.received += 1
            try:
                handler(frames)
            except Exception:  # (handlers are contained: this is the last guard, the socket reads on)
                log.error("broadcast socket: handler failed; message dropped", exc_info=True)
        self.io_loop.add_callback(self._ready)  # more waiting: on the next turn

    def close(self, linger=None):
        if self.socket is not None and not self.socket.closed:
            self.io_loop.remove_handler(self.socket)
            self.socket.close(linger=linger)
