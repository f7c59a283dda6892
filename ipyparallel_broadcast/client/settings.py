"""The ``Client``'s own settings: traitlets, set as keywords of
``ipb.Client(...)`` or as ``c.Client.<name>`` in a profile's config, and what
changes when one is set on a running client."""

from __future__ import annotations

from traitlets import Enum, Float, Integer, observe

from ..host import shm
from .upstream import Upstream


class Settings(Upstream):
    """Part of ``Client`` (``client``): its configurable traits."""

    history_limit = Integer(
        10_000,
        config=True,
        help="The client's and each BroadcastView's history keep this many entries (a broadcast "
        "is one, a DirectView call one per engine) and forget the oldest: a client that calls for "
        "days stays the same size. Indices do not move; a forgotten one raises IndexError. 0 keeps all.",
    )

    broadcast_results_kept = Integer(
        16,
        config=True,
        help="How many recent broadcast calls' results get_result() and %pxresult can recall.",
    )
    broadcast_outcomes_kept = Integer(
        4096,
        config=True,
        help="At most this many engines' results, in all, are kept for the recent calls "
        "(the last call always is): kept objects cost every garbage collection.",
    )

    root_ping_interval = Float(
        0.5,
        config=True,
        help="Seconds between pings to the root about requests in flight (a root that "
        "restarted has lost them: they fail). No pings while nothing is in flight.",
    )
    root_timeout = Float(10.0, config=True, help="A root silent this long loses what is in flight.")
    heap_trim_interval = Float(
        0.0,
        config=True,
        help="Seconds between the client's returns of freed heap to the OS (glibc's malloc_trim, "
        "on the I/O thread, only while replies come): replies are allocated by one thread and "
        "freed by another, and glibc keeps their pages, so a client's RSS creeps up over "
        "hundreds of thousands of calls. A trim stalls the client's threads while it runs "
        "(tens to a couple of hundred milliseconds on a large heap): 0, the default, never trims.",
    )

    @observe("heap_trim_interval")
    def _heap_trim_interval_changed(self, change):
        if getattr(self, "_heap_trims", None) is not None and self._loop is not None:
            self._loop.add_callback(self._heap_trims.schedule)

    shared_reply_threshold = Integer(
        shm.REPLY_THRESHOLD,
        config=True,
        help="Engines on the client's host put reply buffers of this many bytes or more "
        "(a pulled or gathered array) in shared memory, once: the relays carry the "
        "segment's name, and the client reads it once (no copy through the tree). 0: never.",
    )

    @observe("shared_reply_threshold")
    def _shared_reply_threshold_changed(self, change):
        self._shared.ask(change["new"], self._shared.here)

    shared_reply_kept = Integer(
        256 << 20,
        config=True,
        help="Bytes of memory the client keeps for big replies read from shared memory "
        "(see shared_reply_threshold) once no result holds them: the next ones are read "
        "into pages already in place, not fresh ones faulted in a page at a time (a gather "
        "of 8 x 1 MiB: 9.0 to 6.9 ms of the client's CPU). It covers the recent calls' "
        "results (broadcast_results_kept) and a call more. 0: none kept.",
    )

    @observe("shared_reply_kept")
    def _shared_reply_kept_changed(self, change):
        self._shared.buffers.limit = change["new"]
        if change["new"] < self._shared.buffers.kept:
            self._shared.buffers.clear()

    broadcast_path = Enum(
        ["auto", "tree", "direct"],
        "auto",
        config=True,
        help="The way views' scatter, gather and map go: 'tree', 'direct' (DirectView's, "
        "one message per engine through the hub's mux) or 'auto': the one measured faster "
        "for calls of that kind and size (see ipyparallel_broadcast.client.paths).",
    )

    @observe("history_limit")
    def _history_limit_changed(self, change):
        self.history.limit = change["new"]

    # the parts' settings (``supervision``, ``iopublive``, ``roster``)
    controller_timeout = Float(
        10.0,
        config=True,
        help="Seconds without a beat from the controller after which the client's outstanding "
        "requests fail, naming it (its hub died). 0: never.",
    )
    iopub_timeout = Float(
        10.0,
        config=True,
        help="Seconds a new client waits for proof that its IOPub subscription is live "
        "before it sends anything (outputs published before it is live are lost); 0: no wait.",
    )
    output_timeout = Float(
        10.0,
        config=True,
        help="Seconds after an engine's reply that its output may still come on IOPub; "
        "then wait_for_output() stops waiting for it, and its stderr says so.",
    )
    roster_timeout = Float(
        10.0,
        config=True,
        help="Seconds a new client waits for the controller's whole engine table, sent once its "
        "subscription to registrations is live; 0: no wait (rc.ids may then be short for a moment).",
    )
