"""What the controller tells its clients about itself, on a socket of their own.

- ``ipb_restarted``: a child process died, and what it held is lost. A
  client fails its requests that went through it (``client.supervision``).
- ``ipb_beat``: the controller lives, once per ``interval``, and who keeps
  it (``keeper``: a pid, or None). A client with requests outstanding that
  hears no beat for its ``controller_timeout`` fails them, naming the
  controller: its hub died (or cannot be reached).

A PUB of its own, not the hub's notification socket: ipyparallel's client
raises on a notification type it does not know, and that stops the stream
it reads. The beats come from a thread, not the hub's event loop, so a hub
busy filing a big result is not taken for a dead one. Messages are signed
with the cluster's key.
"""

from __future__ import annotations

import logging
import os
import queue
import threading

import zmq
from jupyter_client.session import Session

from ..wire import protocol as P

log = logging.getLogger(__name__)
INTERVAL = 1.0  # seconds between beats


class Notices:
    """``publish(kind, content)`` from any thread; a thread owns the socket."""

    def __init__(self, session: Session, url: str, bind, interval: float = INTERVAL, facts=dict):
        self.session = Session(
            key=session.key,
            signature_scheme=session.signature_scheme,
            packer=session.packer,
            unpacker=session.unpacker,
        )  # the thread's own: HMAC state is not shared across threads
        self.url, self.bind, self.interval = url, bind, interval
        self.facts = facts  # what each beat says besides the pid (its keeper: ``keeperwatch``)
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        self.sent = 0
        self.thread = threading.Thread(target=self._run, name="ipb-notices", daemon=True)

    def start(self):
        self.thread.start()

    def publish(self, kind: str, content: dict):
        self.outbox.put((kind, content))

    def stop(self):
        self.outbox.put(None)

    def _run(self):
        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.PUB)
        sock.linger = 1000
        sock.SNDHWM = 0  # a notice is never dropped for a slow client
        self.bind(sock, self.url)
        pid = os.getpid()
        try:
            while True:
                try:
                    item = self.outbox.get(timeout=self.interval)
                except queue.Empty:
                    item = (P.BEAT, dict(self.facts(), pid=pid))
                if item is None:
                    return
                kind, content = item
                try:
                    self.session.send(sock, kind, content=content)
                    self.sent += 1
                except zmq.ZMQError:
                    log.error("could not publish a %s notice", kind, exc_info=True)
        finally:
            sock.close()
