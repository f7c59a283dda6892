"""The controller's heart monitor: ipyparallel's, reading its pongs once per beat.

ipyparallel's ``HeartMonitor`` watches its pong socket from the event loop:
every pong wakes the loop and is handled on its own. With a host relay
beating for each host, that is one wake-up per host per period: at 64 hosts
and the controller's 0.8 s period, 0.6 % of a core while nothing else
happens. Its ``beat`` already begins by reading every pong waiting
(``ZMQStream.flush``, a poll per pong); ours leaves the pongs queued in the
socket until then, and reads them in one loop first: an answer to the last
ping counts at once, any other goes to ipyparallel's ``handle_pong`` (a pong
that comes in between is the flush's, handled as before). The same pongs
count against the same ping (each carries the ping's time), and a quiet
controller wakes once per period.
"""

from __future__ import annotations

import zmq
from ipyparallel.controller.heartmonitor import HeartMonitor

from ..compat import ipp


class DrainingHeartMonitor(HeartMonitor):
    """``HeartMonitor``, its pongs read when it beats, not as each comes."""

    def start(self):
        super().start()
        stream = self.pong_stream  # (its reader stays: the beat's flush calls it)
        stream.io_loop.remove_handler(stream.socket)

    def beat(self):
        self.drain()
        super().beat()

    def drain(self) -> int:
        """Read every pong waiting; how many."""
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
