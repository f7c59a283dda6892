"""The client's heap handed back to the OS while replies come (``host.trim``):
replies are allocated by the I/O thread and freed by the user's, and glibc
keeps their pages, so a client's RSS creeps up over hundreds of thousands of
calls. Off unless ``Client.heap_trim_interval`` is set (a trim stalls the
client's threads while it runs)."""

from __future__ import annotations

from tornado.ioloop import PeriodicCallback

from ..host.trim import HeapTrimmer
from .guard import guarded_callback


class HeapTrims:
    """A part of our Client: trims every ``heap_trim_interval`` seconds on its
    I/O thread, when replies came since the last (``client._replies.received``)."""

    def __init__(self, client):
        self.client = client
        self.trimmer = HeapTrimmer()
        self.timer: PeriodicCallback | None = None
        self.at = self.checks = 0  # replies read at the last trim; checks made

    def schedule(self):
        """I/O thread: trims every ``heap_trim_interval`` seconds (again when it changes)."""
        if self.timer is not None:
            self.timer.stop()
            self.timer = None
        interval = self.client.heap_trim_interval
        if self.trimmer.trim is not None and interval > 0:
            self.timer = PeriodicCallback(guarded_callback(self.check, "heap trim"), interval * 1e3)
            self.timer.start()

    def check(self):
        """Freed heap back to the OS, if replies came since the last time."""
        self.checks += 1
        received = self.client._replies.received
        if received != self.at:
            self.at = received
            self.trimmer.run()
