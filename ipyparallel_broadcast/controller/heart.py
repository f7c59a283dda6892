"""The controller's heart monitor: ipyparallel's, reading its pongs once per beat.

ipyparallel's ``HeartMonitor`` wakes for every pong (a ``ZMQStream`` callback
through the event loop) and checks it there. With a host relay beating for
each host, that is one wake-up per host per period: at 64 hosts and the
controller's 0.8 s period, 0.6 % of a core while nothing else happens. Ours
leaves the pongs queued in the socket and reads them all when it beats, as
the stock one's ``beat`` first flushes them: the same pongs are counted
against the same ping, and a quiet controller wakes once per period.
"""

from __future__ import annotations

import time

import zmq
from ipyparallel.controller.heartmonitor import HeartMonitor
from tornado import ioloop

from ..compat import ipp


class DrainingHeartMonitor(HeartMonitor):
    """``HeartMonitor``, its pongs read once per beat rather than one by one."""

    def start(self):
        """As ipyparallel's, without a callback per pong."""
        self.log.debug("heartbeat::waiting for subscription")
        self.monitor_stream.socket.recv_multipart()  # the hub's subscription
        self.tic = time.monotonic()
        self.caller = ioloop.PeriodicCallback(self.beat, self.period)
        self.caller.start()

    def beat(self):
        self.drain()
        super().beat()

    def drain(self) -> int:
        """Read every pong waiting: an answer to the last ping counts at once;
        any other goes through ipyparallel's ``handle_pong`` (which logs it)."""
        sock, responses = self.pong_stream.socket, self.responses
        current = str(self.lifetime).encode("ascii")
        n = 0
        while True:
            try:
                msg = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return n
            n += 1
            if len(msg) == 2 and msg[1] == current:
                responses.add(msg[0])
            else:
                self.handle_pong(msg)


def start_heart_monitor(**kwargs):
    """A child process's target: the heart monitor above, as ipyparallel starts its own."""
    ipp.start_heart_monitor(DrainingHeartMonitor, **kwargs)
