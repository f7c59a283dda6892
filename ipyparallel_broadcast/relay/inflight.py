"""A request in flight at a node, and how its outcomes are packed to go up.

A request is *pending* from dispatch until every target's outcome (a reply
or a failure) has gone up; its ``state`` (``state.RequestState``) holds what
it still waits for, and its phase.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..wire import bundles as B
from ..wire import protocol as P
from ..wire.reduction import Reduction
from .events import MON, UP, Send
from .state import RequestState
from .stock import CompatRequest


@dataclass
class Pending:
    key: str
    msg_id: str
    stream: bool
    route: list  # idents replies go up with (at the root: the client's)
    inner: list  # the request frames engines get (shared by all of them)
    state: RequestState = field(default_factory=RequestState)  # what it waits for, and its phase
    parts: list = field(default_factory=list)  # coalesced so far
    bundles: list = field(default_factory=list)  # leaf: host relays' bundles, coalesced so far
    failed: list = field(default_factory=list)  # coalesced so far
    compat: CompatRequest | None = None  # root: request from a stock client
    rename: Callable[[str], list] | None = None  # leaf: per-engine frames
    raw: bool = False  # leaf: send engine replies as signed (for a stock client)
    stock: bool = False  # a stock client's request (no hub records: see ``records``)
    own: dict[int, list] | None = None  # scatter/map: each target's own buffers
    batch: tuple | None = None  # streaming in batches: (count, interval)
    n: int = 0  # engines targeted
    held: list = field(default_factory=lambda: [[], [], []])  # leaf batch: parts, failed, eids
    relayed: list = field(default_factory=list)  # streamed child bundles held: (body, eids)
    deadline: float | None = None  # leaf batch: when the held outcomes must go up
    reduction: Reduction | None = None  # reduce: what this node combined
    raised: list = field(default_factory=list)  # reduce: replies of engines that raised
    then: Callable[[Pending], list] | None = None  # root: what follows once complete (an allreduce's second half)
    quiet: bool = False  # no copies of its replies to the hub's records
    ring_ok: bool = False  # an allreduce whose targets are all under this node: its hosts may ring
    ring_bind: str | None = None  # an allreduce's second half: the name hosts bind the ring's value to
    segments: list = field(default_factory=list)  # reduce: segments of this host its values are in
    recorded: list = field(default_factory=list)  # reduce: its engines' replies, for the hub's records
    share_up: Callable | None = None  # reduce: how its value goes up by a segment's name (Sharing.passer)
    trace: list | None = None  # traced request: [event, wall time, detail] at this node
    shared: Any | None = None  # big buffers in shared memory (sharing.Shared)
    big: bool = False  # has buffers for shared memory or chunks: ``sharing`` and ``bulk`` see it
    forwarders: dict | None = None  # leaf: host relay -> the host relay passing it the call (``forwarding``)

    def owner_of(self, host: bytes) -> bytes:
        """Leaf: the child that owes ``host``'s outcomes: the head that it was passed the call below."""
        forwarders = self.forwarders or {}
        while host in forwarders:
            host = forwarders[host]
        return host

    def request_for(self, sub: list[int], mode, shared=None) -> tuple:
        """Content and frames of this request for a child serving ``sub``;
        ``shared``: its big buffers go as a segment of this host (a child relay here)."""
        content = P.request_content(self.msg_id, sub, P.STREAM if self.stream else P.COALESCE, req=self.key)
        frames = self.inner
        if shared is not None:
            content["shm"], frames = shared.content(), shared.inner
        if mode:
            content["compat"] = mode
        if self.own is not None:  # only this subtree's share goes down
            content["each"] = [len(self.own[e]) for e in sub]
            frames = frames + [f for e in sub for f in self.own.pop(e)]
        if self.batch:
            content["batch"] = list(self.batch)
        if self.reduction is not None:
            content["reduce"] = self.reduction.op
        if self.ring_ok and len(sub) == self.n:  # (a child with only some targets: no ring below)
            content["ring_ok"] = True
        if self.ring_bind is not None:
            content["ring_bind"] = self.ring_bind
        if self.quiet:
            content["quiet"] = True
        if self.trace is not None:
            content["trace"] = True
        return content, frames


def pack_up(codec: P.Codec, p: Pending, parts, failed, eids, kind: str) -> list[Send]:
    """Outcomes going up: one bundle, or stock replies for a stock client."""
    if p.reduction is not None:
        state, frames = p.reduction.state(p.share_up)
        body = B.pack_reduced(codec, p.key, p.msg_id, state, frames, p.raised, failed)
        return [Send(UP, P.with_route(p.route, body))]
    if p.bundles and kind == "engines":  # a leaf with host relays: its own engines nest too
        parts = ([own_bundle(codec, p, parts)] if parts else []) + p.bundles
        kind = "bundles"
    if p.compat is not None:
        return [Send(UP, P.with_route(p.route, b)) for b in p.compat.replies(codec, kind, parts, failed)]
    if kind == "engines" and not p.raw:
        body = B.pack_replies(codec, p.key, p.msg_id, parts, failed, eids)
    else:
        body = B.pack_bundle(codec, p.key, p.msg_id, kind, parts, failed, eids)
    return [Send(UP, P.with_route(p.route, body))]


def own_bundle(codec: P.Codec, p: Pending, parts):
    """A leaf's direct engines' replies as one nested bundle (parsed, for a
    stock client's root)."""
    if p.raw:
        body = B.pack_bundle(codec, p.key, p.msg_id, "engines", parts, [])
    else:
        body = B.pack_replies(codec, p.key, p.msg_id, parts, [])
    return codec.unpack(body) if p.compat is not None else body


class InFlight:
    """A node's pending requests: outcomes recorded, batched, packed and sent
    up, and each request dropped once every target's outcome has gone up.
    Finished traced requests' events are kept for surveys (``traces``)."""

    traces_kept = 64  # finished traced requests whose events a survey can still fetch

    def __init__(
        self,
        codec: P.Codec,
        kind: str,
        batches: bool,
        clock,
        wall,
        engines: dict | None = None,
        *,
        coalesce: bool = False,
        records: bool = False,
    ):
        self.codec, self.kind, self.batches, self.clock, self.wall = codec, kind, batches, clock, wall
        self.engines = {} if engines is None else engines  # the node's engine table (id -> uuid), read only
        # streaming: hold what is ready until the shell has read every message
        # waiting on its sockets (``drained``), then send it up as one bundle:
        # replies that came together go together, and none waits for more
        self.coalesce = coalesce
        self.records = records  # the root: a copy of each bundle sent up goes to the hub's records
        self.dirty: dict[str, Pending] = {}  # requests holding streamed outcomes
        self.requests: dict[str, Pending] = {}
        self.parked: set[str] = set()  # leaf: keys of requests with parked targets
        self.traces: OrderedDict = OrderedDict()  # msg_id -> events of a finished traced request
        self.on_done: list[Callable[[Pending], None]] = []  # each called as a request leaves this node
        self.on_big_done: list[Callable[[Pending], None]] = []  # ... a request with big buffers

    # ------------------------------------------------ the requests it holds
    def __contains__(self, key) -> bool:
        return key in self.requests

    def get(self, key) -> Pending | None:
        return self.requests.get(key)

    def open(self, key: str, **fields) -> Pending:
        """A new request in flight here, ``Pending(key, **fields)``."""
        p = self.requests[key] = Pending(key=key, **fields)
        return p

    def park(self, p: Pending) -> None:
        """``p`` has targets this leaf does not know yet (``retry`` them when the hub's news comes)."""
        self.parked.add(p.key)

    def take_parked(self) -> list[Pending]:
        """The requests parked, still in flight; none is parked any more (``park`` again)."""
        keys, self.parked = self.parked, set()
        return [p for p in map(self.requests.get, keys) if p is not None]

    def when_done(self, callback: Callable[[Pending], None], big_only: bool = False) -> None:
        """``callback(p)`` as each request (or each with big buffers) leaves this node."""
        (self.on_big_done if big_only else self.on_done).append(callback)

    def stamp(self, p: Pending, event: str, detail=None, ago: float = 0.0):
        """Note ``event`` in a traced request's trace (``ago`` seconds ago)."""
        if p.trace is not None:
            p.trace.append([event, self.wall() - ago, detail])

    def file_trace(self, p: Pending) -> None:
        """Keep a traced request's events once it is done here (with those of
        an earlier step of the same call: an allreduce's two halves). Its later
        stamps (a step that follows) go to the same list."""
        if p.trace is None:
            return
        if p.msg_id in self.traces and self.traces[p.msg_id] is not p.trace:
            self.traces[p.msg_id].extend(p.trace)
            p.trace = self.traces[p.msg_id]
        self.traces[p.msg_id] = p.trace
        while len(self.traces) > self.traces_kept:
            self.traces.popitem(last=False)

    def trace_of(self, msg_id) -> list:
        events = self.traces.get(msg_id)
        if events is None:  # still in flight
            events = next((p.trace for p in self.requests.values() if p.msg_id == msg_id), None)
        return list(events or [])

    def record_failures(self, p: Pending, failed) -> list[Send]:
        if not failed:
            return []
        if p.stream:
            return self.emit(p, [], failed, [f[0] for f in failed])
        p.failed.extend(failed)
        return []

    def fail(self, p: Pending, eids, code: str, reason: str) -> list[Send]:
        """Engines ``eids`` of ``p`` fail: "Engine {eid} {reason}"."""
        return self.record_failures(p, [[e, self.engines.get(e), f"Engine {e} {reason}", code] for e in eids])

    def fail_waiting_on(self, dest, code: str, message: Callable[[int], str], keys=None) -> list[Send]:
        """Every request waiting on ``dest`` (a child, or an engine's uuid), or
        those of ``keys`` only: its engines there fail."""
        uuid = dest if isinstance(dest, str) else None
        return self.fail_dest(dest, lambda e: [e, uuid or self.engines.get(e), message(e), code], keys)

    def fail_dest(self, dest, failure: Callable[[int], list], keys=None) -> list[Send]:
        """Every request waiting on ``dest`` (or those of ``keys``): its engines there fail."""
        sends = []
        for p in list(self.requests.values()) if keys is None else filter(None, map(self.requests.get, keys)):
            eids = p.state.give_up(dest)
            if eids:
                sends += self.record_failures(p, [failure(e) for e in sorted(eids)]) + self.finish_if_done(p)
        return sends

    def owed_by(self, dest) -> set[str]:
        """The keys of the requests waiting on ``dest``."""
        return {k for k, p in self.requests.items() if p.state.owes(dest)}

    def fail_via(self, host: bytes, eid: int, failure: list) -> list[Send]:
        """Fail one engine that a host relay owes, here (the relay may still
        answer for it later: that outcome then comes twice, and is tolerated)."""
        sends = []
        for p in list(self.requests.values()):
            if p.state.settle_via(p.owner_of(host), eid):
                sends += self.record_failures(p, [failure]) + self.finish_if_done(p)
        return sends

    def finish_if_done(self, p: Pending) -> list[Send]:
        if not p.state.complete or self.requests.get(p.key) is not p:
            return []
        p.state.finish()
        del self.requests[p.key]
        for done in self.on_big_done if p.big else ():  # its segment and chunk transfers go
            done(p)
        self.parked.discard(p.key)
        self.dirty.pop(p.key, None)
        self.file_trace(p)
        if p.then is not None:  # it goes on: what goes up is the next step's to say
            sends = p.then(p)
        else:
            sends = self.release(p, final=True) if p.stream else self.deliver(p, p.parts, p.failed, None)
        for done in self.on_done:  # (after what went up: a reduce's value may have gone by its segment's name)
            done(p)
        return sends

    def emit(self, p: Pending, parts, failed, eids) -> list[Send]:
        """Streaming: send outcomes up now, or hold them for the leaf's batch."""
        batch = self.batches and p.batch
        if not batch and not (self.coalesce and p.compat is None):
            return self.deliver(p, parts, failed, eids)
        for held, new in zip(p.held, (parts, failed, eids)):
            held.extend(new)
        if not batch:
            self.dirty[p.key] = p
            return []
        count_, interval = p.batch
        if len(p.held[2]) >= count_:
            return self.flush(p)
        if p.deadline is None and interval is not None:
            p.deadline = self.clock() + interval
        return []

    def flush(self, p: Pending) -> list[Send]:
        parts, failed, eids = p.held
        p.held, p.deadline = [[], [], []], None
        return self.deliver(p, parts, failed, sorted(eids)) if eids else []

    def due(self, now) -> list[Send]:
        """Batches whose interval is over."""
        return [
            s
            for p in list(self.requests.values())
            if p.deadline is not None and p.deadline <= now
            for s in self.flush(p)
        ]

    def next_deadline(self) -> float | None:
        return min((p.deadline for p in self.requests.values() if p.deadline is not None), default=None)

    def deliver(self, p: Pending, parts, failed, eids, kind=None) -> list[Send]:
        """Send outcomes up: a bundle, or stock replies to a stock client."""
        sends = pack_up(self.codec, p, parts, failed, eids, kind or self.kind)
        self.stamp(p, "reply out", len(parts) + len(failed))
        return self.recorded(p, sends, p.n if eids is None else len(eids))

    def recorded(self, p: Pending, sends: list[Send], outcomes: int) -> list[Send]:
        """``sends`` (bundles going up), and their copies for the hub's records,
        labelled with how many engines' outcomes they carry (the hub bounds its journal so)."""
        if p.recorded:  # a reduce's engine replies here, in one copy (the bundles carry only the value)
            body = B.pack_bundle(self.codec, p.key, p.msg_id, "engines", p.recorded, [])
            label, p.recorded = b"%d" % len(p.recorded), []
            return sends + [Send(MON, P.record_copy(P.OUTBUNDLE, label, body))]
        if not self.records or p.stock or p.reduction is not None:
            return sends
        n = len(p.route) + 1  # the body follows the route and DELIM
        label = b"%d" % outcomes
        return sends + [Send(MON, P.record_copy(P.OUTBUNDLE, label, s.frames[n:])) for s in sends]

    def forward(self, p: Pending, msg: dict, body: list) -> list[Send]:
        """Pass a child's streamed bundle up unchanged (or held, see ``coalesce``)."""
        if p.compat is not None:
            self.stamp(p, "reply out", "forwarded")
            return self.deliver(p, [msg], [], None, "bundles")
        if self.coalesce and not p.batch:  # a batch stays the size that was asked
            p.relayed.append((body, msg["metadata"]["eids"]))
            self.dirty[p.key] = p
            return []
        self.stamp(p, "reply out", "forwarded")
        return self.recorded(p, [Send(UP, P.with_route(p.route, body))], len(msg["metadata"]["eids"]))

    def drained(self) -> list[Send]:
        """The shell read all that was waiting: send up what streaming held."""
        sends = []
        for p in self.dirty.values():
            sends += self.release(p)
        self.dirty.clear()
        return sends

    def release(self, p: Pending, final: bool = False) -> list[Send]:
        """A streaming request's held outcomes, up: its own engines' in one
        bundle, its children's bundles (several nested in one) in another. A
        leaf's batch waits for its count or interval, unless ``final``."""
        sends = self.flush(p) if final or not (self.batches and p.batch) else []
        if p.relayed:
            bodies = [b for b, _ in p.relayed]
            eids = sorted(e for _, es in p.relayed for e in es)
            p.relayed = []
            self.stamp(p, "reply out", f"{len(bodies)} forwarded")
            body = (
                bodies[0]
                if len(bodies) == 1
                else B.pack_bundle(self.codec, p.key, p.msg_id, "bundles", bodies, [], eids)
            )
            sends += self.recorded(p, [Send(UP, P.with_route(p.route, body))], len(eids))
        return sends
