"""The relay node as a pure state machine: frames and events in, sends out.

One ``RelayNode`` sits at each tree position, and one on each engine host (a
host relay). It never touches a socket: ``on_up`` / ``on_down`` / ``on_hub``
take the frames a socket received (parsed once, by ``events``), the other
``on_*`` methods what the shell learned, and each returns the ``Send`` list
the shell performs. It inherits from nothing: it holds its parts as
fields, each owning its state and given only what it needs (a
``NodeContext``, collaborators, callbacks):

- ``down`` (a request's way down: split, sent to engines, parked) and
  ``up`` (replies' way up: filed, folded, packed), the request's own flow;
- ``inflight`` (requests in flight and how their outcomes are packed),
  ``routes`` (where engines are), ``children`` (alive or not), ``announce``
  (routes told up), ``surveys`` (stats), ``sharing`` (one copy per host);
- ``heartbeats`` (pings and pongs) and ``deadlines`` (every part's timers);
- ``big`` (``bigdata``): the data plane and the parts that use it (a push's
  chunks, a reduce's chains, an allreduce's rings, the in-host fold).
"""

from __future__ import annotations

import logging
import time
import uuid as uuidlib
from collections.abc import Callable
from itertools import count

from ..wire import protocol as P
from ..wire.topology import Path, TreeShape, node_name
from . import events as E
from .bigdata import BigData
from .children import Children
from .context import NodeContext
from .deadlines import Deadlines
from .down import DownFlow
from .engines import EngineTable
from .events import MON, Send
from .flow import FlowParts
from .forwarding import DEFAULT_HOST_FANOUT, Forwarding, from_passing, passed
from .heartbeat import Heartbeats
from .inflight import InFlight
from .routes import Announcements, Key, Routes
from .sharing import Sharing
from .surveys import Surveys, own_trace
from .up import UpFlow

log = logging.getLogger(__name__)


class RelayNode:
    """Routing, fan-out and coalescing for one node of the tree: its entry
    points, which parse an event and hand it to the part it is for."""

    def __init__(
        self,
        codec: P.Codec,
        shape: TreeShape,
        path: Path = (),
        clock: Callable[[], float] = time.monotonic,
        ping_interval: float = 0.5,
        node_timeout: float = 10.0,
        wall: Callable[[], float] = time.time,
        host: str | None = None,
        store=None,
        bulk: dict | None = None,
        *,
        coalesce: bool = False,
        records: bool = False,
        probe: Callable[[], dict] = dict,
        host_fanout: int = DEFAULT_HOST_FANOUT,
    ):
        """``coalesce``: streamed replies read together go up together (``drained``).
        ``records``: copies to the hub's task records (MON): the root's of each
        request and bundle up; a leaf's of each engine's reply to a reduction.
        ``probe``: the process's facts (RSS...) for its surveys. ``host_fanout``: a leaf
        sends a call to at most this many host relays, which pass it on (``forwarding``; 0: to each)."""
        self.codec, self.clock, self.shape, self.wall = codec, clock, shape, wall  # wall: for traces, across processes
        self.path, self.host = tuple(path), host  # a host relay: its leaf's path; its label (it serves who joined)
        self.name = f"host {host}" if host else node_name(self.path)
        self.is_root = not self.path and not host
        self.is_leaf = bool(host) or shape.is_leaf(self.path)
        self.kind = "engines" if self.is_leaf else "bundles"
        self.boot = uuidlib.uuid4().hex  # this process's life: a restart changes it
        self.ping_interval, self.node_timeout = ping_interval, node_timeout
        self.children = Children(
            self.path, [] if self.is_leaf else range(shape.fanout), clock, ping_interval, node_timeout
        )
        self.routes = Routes(shape, self.path, self.is_leaf)
        self.announce = Announcements(codec, self.routes, self.children.idents, self.is_root, host, self.boot)
        self.surveys = Surveys(codec)
        self.ctx = NodeContext(codec, clock, self.name, self.boot, self.is_root, host, self._drop)
        self.deadlines = Deadlines()  # every part's timers: ``on_tick`` fires them
        self.engines = EngineTable()  # leaf: engine id -> uuid; changed in place (the parts share it)
        self.records = records = records and (self.is_root or self.is_leaf)
        flight = dict(coalesce=coalesce, records=records and self.is_root)
        self.inflight = InFlight(codec, self.kind, self.is_leaf, clock, wall, self.engines, **flight)
        self.pending = self.inflight.requests  # key -> Pending (read only: ``inflight`` owns it)
        self.sharing = Sharing(codec, store)  # big buffers, once per host
        self.deadlines.add("batches", self.inflight.next_deadline, self.inflight.due)
        self.big = BigData.build(  # the data plane, and the parts that use it
            self.ctx,
            self.inflight,
            self.children,
            self.sharing,
            self.deadlines,
            stall=2 * node_timeout,
            spec=bulk,
            fail=self.inflight.fail,
            stalled=lambda now: self.down.chunks_in.stalled(now),
        )
        self.heartbeats = Heartbeats(
            self.ctx,
            self.children,
            self.deadlines,
            self.inflight,
            child_lost=self.on_child_lost,
            held=lambda: {p.msg_id for p in self.pending.values()} | self.surveys.msg_ids(),
            reannounce=lambda: self.announce.again(self.engines),
            parent_restarted=self.big.leaf_restarted,
        )
        for release in (self.sharing.release, self.big.push_out.release, self.big.push_in.release):
            self.inflight.when_done(release, big_only=True)  # a big request left
        self.inflight.when_done(self.sharing.drop_values)  # (a reduce's segments)
        self.dropped = 0  # messages dropped as malformed or unexpected
        self.probe = probe
        # a restarted root must not reuse the keys of requests engines may still answer
        self._keys = count(int(self.boot[:8], 16) << 20)
        timing = (lambda: self.heartbeats.bulk_url), self.deadlines, node_timeout  # (its chunk socket)
        self.forwarding = Forwarding(self.ctx, self.inflight, self.children, host_fanout, *timing)
        parts = (self.inflight, self.engines, self.routes, self.children, self.sharing, self.big, self.forwarding)
        flow = FlowParts(self.ctx, self.is_leaf, *parts)
        # a buffer this big takes the big-data path (``sharing``, ``push_out``, ``push_in``); a
        # request without one never calls into them
        big_from = min(t for t in (self.big.push_out.threshold, self.sharing.threshold) if t is not None)
        self.down = DownFlow(flow, wall=wall, keys=self._keys, big_from=big_from)
        self.up = UpFlow(
            flow,
            announce=self.announce,
            surveys=self.surveys,
            heartbeats=self.heartbeats,
            records=records,
        )

    # ------------------------------------------------------------------ events
    def on_up(self, frames) -> list[Send]:
        """From above: a client's request or ping (root), or the parent's."""
        arrived = self.wall()
        try:
            event = E.from_above(self.codec, frames, self.is_root, bool(self.host))
            if isinstance(event, E.Request):
                dropped = self.dropped
                sends = self.down.start(event.route, event.content, event.inner, arrived=arrived)
                if self.records and self.is_root and self.dropped == dropped:  # taken: filed
                    inner_buffers = len(event.inner) - 5  # the user's data: kept out of the hub
                    sends.insert(0, Send(MON, [P.INBCAST] + P.strip_big(event.frames, inner_buffers)))
                return sends
            if isinstance(event, E.StockRequest):
                return self.down.start(event.route, event.compat.content, event.compat.inner, event.compat)
            if isinstance(event, E.StatsRequest):
                key = f"s{next(self._keys)}" if self.is_root else event.content.get("req")
                own = self.stats(own_trace(event.content))
                return self.surveys.start(key, event.route, event.content, self.children.idents, own)
            if isinstance(event, E.Ping):
                beats = self.heartbeats
                return beats.client_ping(event) if self.is_root else beats.parent_ping(event.content)
            if isinstance(event, E.RouteAck):
                return self.announce.ack(event.content)
            if isinstance(event, E.ChainEnd):
                return self.big.leaf_ended(event.keys, event.why)
            if isinstance(event, E.HostLost):  # a host relay this one may pass calls to
                self.forwarding.lost(event.boot)
                return self.on_child_lost(event.ident, event.why)
            return self.on_engine_lost(event.uuid, event.why)  # E.Lost
        except P.ProtocolError as e:
            return self._drop(f"request: {e}")

    def on_down(self, frames) -> list[Send]:
        """From below: an engine's reply, or a child node's or host relay's message."""
        try:
            event = E.from_below(self.codec, frames, self.is_leaf)
            if isinstance(event, E.EngineReply):
                return self.up.engine_reply(event)
            return self.up.child_message(event)
        except P.ProtocolError as e:
            return self._drop(f"reply: {e}")

    def on_hub(self, frames) -> list[Send]:
        """A leaf's news from the hub: engines registered or lost, or its registry."""
        try:
            event = E.from_hub(self.codec, frames)
        except P.ProtocolError as e:
            return self._drop(f"hub: {e}")
        if isinstance(event, E.EngineRegistered):
            return self.down.registered({event.eid: event.uuid}, greet=True)
        if isinstance(event, E.EnginesRegistered):  # a host's (its relay greets them)
            return self.down.registered(event.engines, greet=False)
        if isinstance(event, E.EnginesUnregistered):
            return [send for uuid in event.uuids for send in self.on_engine_lost(uuid, P.DIED)]
        if isinstance(event, E.HubEngineTable):
            return self.on_registry(event.engines)
        return []

    def on_registry(self, engines: dict[int, str]) -> list[Send]:
        """The hub's full engine table. Parked targets still unknown fail."""
        return self.down.registered(engines, greet=True, whole=True)

    def on_engine_lost(self, uuid: str, why: str = P.DIED) -> list[Send]:
        """An engine can no longer answer (``why``: ``P.DIED``, the hub unregistered it, or a phrase
        such as "is not connected"): what waits on it fails (``UpFlow.engine_lost``); its value is lost."""
        sends = self.up.engine_lost(uuid, why)
        return sends + (self.big.fold.engine_lost(uuid, why) if self.big.fold else [])

    def on_join(self, joins: list[tuple]) -> list[Send]:
        """Host relay: engines of this host joined (again), ``(eid, uuid, who, shm)``
        each (shm: its shared-memory identity). Its leaf learns all of the host's in one
        announcement; once the root has the route, ``Send(JOINED, [who, ...])``."""
        self.engines.update((eid, uuid) for eid, uuid, _, _ in joins)
        sends = self.announce.host_engines(self.engines, [who for _, _, who, _ in joins if who is not None])
        for eid, uuid, _, shm in joins:
            sends += self.sharing.joined(uuid, shm) if shm is not None else self.down.greet([eid])
        return sends

    def on_child_lost(self, key: Key, why: str = "is unreachable") -> list[Send]:
        """A child (relay node or host relay) cannot answer: what waits on it fails."""
        child = self.children.phrase(key)
        lost = f"{child[0].lower()}{child[1:]} {why}"
        sends = self.surveys.child_lost(key, self.children.names.get(key, repr(key)), lost)
        unanswered = self.forwarding.unanswered(key, f"{child} {why}", self.routes.via)
        sends += self.inflight.fail_waiting_on(key, P.UNREACHABLE, unanswered)
        if isinstance(key, bytes):  # a host relay: the hosts it fed chunks to get them from here, and
            sends += self.big.host_lost(key, lost)
            sends += [] if self.host else self.forwarding.host_lost(key, why)  # those passing it a call fail it
            if not self.routes.routes_to(key):
                self.children.forget(key)  # gone, with no engine routed to it
        return sends

    def on_chunk(self, frames) -> list[Send]:
        """A host relay, on its chunk socket: a chunk (``chunks_in``); or a call passed
        on to it, or outcomes of one it passed on (``forwarding``)."""
        if not passed(frames):
            return self.down.chunks_in.on_chunk(frames)
        try:
            event = from_passing(self.codec, frames)
            if isinstance(event, E.Request):  # (its receipt first)
                receipt = self.forwarding.received(event)
                return receipt + self.down.start(event.route, event.content, event.inner, arrived=self.wall())
            return self.up.passed_back(event)
        except P.ProtocolError as e:
            return self._drop(f"passed on: {e}")

    def on_pulse(self, frames) -> list[Send]:
        """A host relay's pong on the pulse link (``heartbeat``)."""
        return self.heartbeats.on_pulse(frames)

    def on_parent_pulse(self, frames) -> list[Send]:
        """A host relay: a ping on the pulse link (``heartbeat``)."""
        return self.heartbeats.on_parent_pulse(frames)

    def on_tick(self) -> list[Send]:
        """Time passed: every part's timers whose deadline has come fire (``deadlines``)."""
        return self.deadlines.fire(self.clock())

    def on_drained(self) -> list[Send]:
        """The shell has read every message waiting on its sockets: streamed
        outcomes held meanwhile go up now (``InFlight.coalesce``)."""
        return self.inflight.drained()

    def next_deadline(self) -> float | None:
        """When ``on_tick`` next has something to do (``None``: nothing timed)."""
        return self.deadlines.next()

    def _drop(self, why: str) -> list[Send]:
        self.dropped += 1
        log.warning("relay node %s dropped a message: %s", self.name, why)
        return []

    def stats(self, trace=None) -> dict:
        """This node's own state, as a survey reports it; with ``trace`` (a
        request's msg_id), the events this node recorded for that request."""
        stats = dict(
            node=self.name,
            pending=len(self.pending),
            parked=len(self.inflight.parked),
            surveys=len(self.surveys),
            dropped=self.dropped,
            signatures=self.codec.remembered,
            engines=(len(self.engines) if self.host else self.routes.count_served(self.engines))
            if self.is_leaf
            else None,
            **self.probe(),
        )
        stats.update(self.sharing.stats() if self.sharing.on else {}, **self.big.stats(), **self.forwarding.stats())
        if self.host:
            stats.update(host=self.host, eids=sorted(self.engines))
        elif self.is_leaf:
            stats["hosts"] = self.children.host_labels()
        if trace is not None:
            stats["trace"] = self.inflight.trace_of(trace)
        return stats
