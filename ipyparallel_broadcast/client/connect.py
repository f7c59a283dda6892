"""A client that connects while the controller restarts.

IPython Parallel's client sends one connection request and waits for its
reply until its ``timeout``: a request the controller took with it when it
died is never answered ("Maybe allow reconnecting?" upstream), and the
client fails though a restarted controller is up seconds later (the chaos
soak's clients, started as the nemesis killed the controller, never ran).

Ours watches the controller's beats meanwhile (``notices``). Its request
goes as ipyparallel sends it, waited for ``SLICE`` seconds; then, while time
is left, the client asks again if a controller beat that it had not heard
before it asked (a restarted one may beat within the slice: it does not have
the request), or else waits on for a new one: a beat from a process it had not
heard, or any beat after silence. A reply that comes is read by ipyparallel's
next try at once (its own request then answered too, and dropped: an unknown
reply on the query socket is), so a request asked again of a slow controller
costs one reply more.
"""

from __future__ import annotations

import time

import zmq
from ipyparallel import util
from jupyter_client.session import Session

SLICE = 2.0  # seconds of a try before the controller's beats are looked at


class BeatWatch:
    """A SUB on the controller's notices, for the pids of its beats."""

    def __init__(self, context: zmq.Context, url: str, session: Session, keys: dict):
        self.session = session
        self.sock = context.socket(zmq.SUB)
        self.sock.linger = 0
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        util.connect(self.sock, url, **keys)
        self.heard: set[int] = set()

    def new_controller(self) -> bool:
        """Whether beats came from a controller process not heard before
        (any, if none was): read what came, without waiting."""
        before = set(self.heard)
        while self.sock.poll(0):
            try:
                _, frames = self.session.feed_identities(self.sock.recv_multipart())
                pid = self.session.deserialize(frames)["content"].get("pid")
            except Exception:  # not the controller's, or garbled: not a beat
                continue
            if isinstance(pid, int):
                self.heard.add(pid)
        return bool(self.heard - before)

    def close(self):
        self.sock.close(linger=0)


def connect_patiently(try_once, query: zmq.Socket, watch: BeatWatch, timeout: float, reset) -> None:
    """``try_once(seconds)``: ipyparallel's connect, which sends a request and
    raises ``TimeoutError`` if no reply came; ``reset()`` lets it try again."""
    deadline = time.monotonic() + timeout
    poller = zmq.Poller()
    poller.register(query, zmq.POLLIN)
    poller.register(watch.sock, zmq.POLLIN)
    while True:
        watch.new_controller()
        heard_when_asked = set(watch.heard)  # the controllers that may have the request
        try:
            return try_once(max(0.0, min(SLICE, deadline - time.monotonic())))
        except TimeoutError:
            if deadline - time.monotonic() <= 0:
                raise
            reset()
        watch.new_controller()
        if watch.heard - heard_when_asked:
            continue  # a controller first heard after the request went: it may not have it, ask it
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("Hub connection request timed out (the controller restarting, or unreachable)")
            ready = dict(poller.poll(1000 * left))
            if query in ready:
                break  # the reply: the next try reads it at once
            if watch.sock in ready and watch.new_controller():
                break  # a controller that does not have the request: ask it
