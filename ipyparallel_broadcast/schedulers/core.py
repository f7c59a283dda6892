"""The relay node as a pure state machine: frames and events in, sends out.

One ``RelayNode`` sits at each tree position. It never touches a socket:
``on_up`` / ``on_down`` take the multipart frames a socket received, the
``on_engine_*`` / ``on_registry`` / ``on_child_lost`` methods take what the
shell learned, and each returns the list of ``Send`` the shell performs.

A request is *pending* at a node from dispatch until every target's outcome
(a reply or a failure) has gone up; then its state is dropped.

Interior nodes ping their children every ``ping_interval`` seconds (driven by
``on_tick``). A child that restarts (its ``boot`` changes), cannot be reached
(the shell calls ``on_child_lost``) or is silent for ``node_timeout`` is lost:
what waits on it fails at once, naming it.
"""

from __future__ import annotations

import logging
import time
import uuid as uuidlib
from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import count
from typing import Callable, Dict, List, Optional, Set

from .. import protocol as P
from ..reduction import Reduction, decode_engine
from ..topology import Path, TreeShape, node_identity, node_name
from .compat import CompatRequest, renamer
from .routes import HOST_PREFIX, Key, Routes

log = logging.getLogger(__name__)

UP, DOWN, HUB = "up", "down", "hub"  # HUB: ask the hub for the engine table
MON = "mon"  # a copy for the hub's task records (see ``records``)
JOINED = "joined"  # host relay: engines (frames: who joined) now reachable through the tree
PARKED = "?"  # waiting-table key for targets whose uuid the leaf must look up


@dataclass
class Send:
    socket: str  # UP, DOWN, HUB or MON
    frames: list


@dataclass
class Pending:
    key: str
    msg_id: str
    stream: bool
    route: list  # idents replies go up with (at the root: the client's)
    inner: list  # the request frames engines get (shared by all of them)
    waiting: Dict[object, Set[int]] = field(default_factory=dict)  # dest -> eids owed
    parts: list = field(default_factory=list)  # coalesced so far
    bundles: list = field(default_factory=list)  # leaf: host relays' bundles, coalesced so far
    settled: Set[int] = field(default_factory=set)  # leaf: engines a host owed, failed here
    failed: list = field(default_factory=list)  # coalesced so far
    compat: Optional[CompatRequest] = None  # root: request from a stock client
    rename: Optional[Callable[[str], list]] = None  # leaf: per-engine frames
    raw: bool = False  # leaf: send engine replies as signed (for a stock client)
    stock: bool = False  # a stock client's request (no hub records: see ``records``)
    own: Optional[Dict[int, list]] = None  # scatter/map: each target's own buffers
    batch: Optional[tuple] = None  # streaming in batches: (count, interval)
    held: list = field(default_factory=lambda: [[], [], []])  # leaf batch: parts, failed, eids
    deadline: Optional[float] = None  # leaf batch: when the held outcomes must go up
    reduction: Optional[Reduction] = None  # reduce: what this node combined
    raised: list = field(default_factory=list)  # reduce: replies of engines that raised
    trace: Optional[list] = None  # traced request: [event, wall time, detail] at this node


@dataclass
class Survey:
    """A stats request in flight at a node (see ``protocol``: ``ipb_stats``)."""

    route: list
    msg_id: object
    owed: Set[int]  # children that have not answered
    nodes: list  # the stats gathered so far, this node's first


class RelayNode:
    """Routing, fan-out and coalescing for one node of the tree."""

    traces_kept = 64  # finished traced requests whose events a survey can still fetch

    def __init__(self, codec: P.Codec, shape: TreeShape, path: Path = (),
                 clock: Callable[[], float] = time.monotonic,
                 ping_interval: float = 0.5, node_timeout: float = 10.0,
                 wall: Callable[[], float] = time.time, host: Optional[str] = None):
        self.codec = codec
        self.clock = clock
        self.wall = wall  # trace timestamps: comparable across processes
        self.shape = shape
        self.path = tuple(path)  # a host relay: its leaf's
        self.host = host  # a host relay's label: it serves the engines that joined it
        self.name = f"host {host}" if host else node_name(self.path)
        self.is_root = not self.path and not host
        self.is_leaf = bool(host) or shape.is_leaf(self.path)
        self.kind = "engines" if self.is_leaf else "bundles"
        self.children: Dict[bytes, Key] = {} if self.is_leaf else {
            node_identity(self.path + (d,)): d for d in range(shape.fanout)
        }  # a leaf's children are the host relays that said hello
        self.idents: Dict[Key, bytes] = {k: i for i, k in self.children.items()}
        self.child_names: Dict[Key, str] = {  # as their stats name them: "0.1", "host h1"
            d: node_name(self.path + (d,)) for d in self.children.values()}
        self.routes = Routes(shape, self.path, self.is_leaf)
        self.parent_boot: Optional[str] = None  # a new one: the parent restarted
        self._route_tokens = count()
        self._joining: Dict[str, list] = {}  # host relay: announcement token -> who joined
        self.pending: Dict[str, Pending] = {}
        self.engines: Dict[int, str] = {}  # leaf: engine id -> uuid
        self.parked: Set[str] = set()  # leaf: keys of requests with PARKED targets
        self.dropped = 0  # messages dropped as malformed or unexpected
        self.surveys: Dict[str, Survey] = {}
        self.probe: Callable[[], dict] = dict  # the shell adds process facts (RSS)
        self._keys = count()
        self.boot = uuidlib.uuid4().hex  # this process's life: a restart changes it
        self.ping_interval, self.node_timeout = ping_interval, node_timeout
        self.heard = {d: clock() for d in self.children.values()}  # child -> last message
        self.boots: Dict[int, str] = {}  # child -> the boot it last reported
        self._next_ping = clock() if self.children and ping_interval else None  # leaves: once a host relay comes
        self.records = False  # copy requests (root) and engine replies (leaves) to MON
        self.traces: OrderedDict = OrderedDict()  # msg_id -> events of a finished traced request

    # ------------------------------------------------------------------ events
    def on_up(self, frames) -> List[Send]:
        """A request from above: a client (root) or the parent node."""
        arrived = self.wall()
        try:
            route, body = P.split_idents(frames)
            msg = self.codec.unpack(body)
            msg_type = msg["header"].get("msg_type")
            if msg_type == P.REQUEST:
                content, dropped = P.validate_request(msg["content"]), self.dropped
                sends = self._start(route, content, msg["buffers"], arrived=arrived)
                if self.records and self.is_root and self.dropped == dropped:  # taken: filed
                    sends.insert(0, Send(MON, [P.INBCAST] + list(frames)))
                return sends
            if msg_type == P.STATS:
                return self._survey(route, msg["content"])
            if msg_type == P.PING:
                return self._client_ping(route, msg["content"]) if self.is_root \
                    else self._parent_ping(msg["content"])
            if msg_type == P.ROUTE_ACK and not self.is_root:
                return self._route_ack(msg["content"])
            if msg_type == P.LOST and self.host:
                content = msg["content"]
                if not isinstance(content, dict) or not isinstance(content.get("uuid"), str):
                    raise P.ProtocolError("engine-lost notice without a uuid")
                return self.on_engine_lost(content["uuid"], content.get("why") or P.DIED)
            if self.is_root and msg_type in CompatRequest.msg_types:
                compat = CompatRequest.parse(msg, body)
                return self._start(route, compat.content, compat.inner, compat)
            raise P.ProtocolError(f"unexpected {msg_type!r} from above")
        except P.ProtocolError as e:
            return self._drop(f"request: {e}")

    def on_down(self, frames) -> List[Send]:
        """A reply from below: an engine's, or a child node's or host relay's."""
        try:
            if self.is_leaf and not P.as_bytes(frames[0]).startswith(HOST_PREFIX):
                return self._engine_reply(frames)
            return self._child_message(frames)
        except P.ProtocolError as e:
            return self._drop(f"reply: {e}")

    def on_engine_registered(self, eid: int, uuid: str) -> List[Send]:
        self.engines[eid] = uuid
        return self._retry_parked(final=False)

    def on_registry(self, engines: Dict[int, str]) -> List[Send]:
        """The hub's full engine table. Parked targets still unknown fail."""
        self.engines = dict(engines)
        return self._retry_parked(final=True)

    def on_engine_lost(self, uuid: str, why: str = P.DIED) -> List[Send]:
        """An engine can no longer answer: ``why`` is ``P.DIED`` (the hub
        unregistered it) or a phrase such as "is not connected". An engine
        behind a host relay is failed by that relay, told here."""
        eid = next((e for e, u in self.engines.items() if u == uuid), None)
        host = self.routes.via.get(eid)
        if why == P.DIED:
            self.engines = {e: u for e, u in self.engines.items() if u != uuid}
            if host is not None:
                self.routes.host_lost_engine(eid)
        code = P.DIED if why == P.DIED else P.UNREACHABLE
        if host is not None and host in self.children:
            notice = Send(DOWN, [host] + self.codec.pack(P.LOST, dict(uuid=uuid, why=why)))
            sends = [notice] + (self._announce([], [eid]) if why == P.DIED else [])
            silent = self.clock() - self.heard[host]
            if silent > 2 * self.ping_interval:  # its relay is not answering either (a host cut off)
                where = f"on host {self.child_names[host][5:]}"
                sends += self._fail_via(host, eid, uuid, code, f"Engine {eid} {where} {why} before "
                                        f"replying (its host relay silent for {silent:.1f} s)")
            return sends
        return self._fail_dest(uuid, code, lambda eid: f"Engine {eid} {why} before replying")

    def on_tick(self) -> List[Send]:
        """Time passed: send up batches whose interval is over; ping children."""
        now = self.clock()
        sends = [s for p in list(self.pending.values())
                 if p.deadline is not None and p.deadline <= now for s in self._flush(p)]
        if self._next_ping is not None and self._next_ping <= now:
            sends += self._ping(now)
        return sends

    def next_deadline(self) -> Optional[float]:
        """When ``on_tick`` next has something to do (``None``: nothing timed)."""
        times = [p.deadline for p in self.pending.values() if p.deadline is not None]
        return min(times + [self._next_ping] if self._next_ping is not None else times,
                   default=None)

    def hello(self) -> List[Send]:
        """Tell the parent this node is alive, and which life of it this is."""
        if self.is_root:
            return []
        return [Send(UP, self.codec.pack(P.PONG, dict(node=self.name, boot=self.boot)))]

    # ---------------------------------------------------------------- routes
    def on_join(self, eid: int, uuid: str, who=None) -> List[Send]:
        """Host relay: an engine on this host joined (again). Its leaf learns
        all of them; once the root has the route, ``Send(JOINED, [who, ...])``."""
        self.engines[eid] = uuid
        return self._host_announce([who] if who is not None else [])

    def _host_announce(self, joining=()) -> List[Send]:
        token = f"{self.boot}:{next(self._route_tokens)}"
        self._joining[token] = list(joining)
        engines = {str(e): u for e, u in self.engines.items()}
        return [Send(UP, self.codec.pack(P.HOST, dict(host=self.host, engines=engines, token=token)))]

    def _host_engines(self, key: bytes, content) -> List[Send]:
        """Leaf: a host relay's engines; route them to it and tell the tree."""
        engines = content.get("engines") if isinstance(content, dict) else None
        try:
            eids = {int(e): u for e, u in engines.items() if isinstance(u, str)}
        except (AttributeError, TypeError, ValueError) as e:
            raise P.ProtocolError(f"bad host engine list: {e}") from e
        for eid, uuid in eids.items():
            self.engines.setdefault(eid, uuid)
        _, gone = self.routes.host_engines(key, eids)
        return self._announce(sorted(eids), gone, key, content.get("token"))

    def _announce(self, add, remove, host: Optional[bytes] = None, token=None) -> List[Send]:
        """Tell the parent which engines are under this node now (or gone)."""
        content = dict(add=add, remove=remove, to=list(self.path),
                       host=host.decode() if host else None, token=token)
        if self.is_root:  # nothing above: the route is complete
            return self._route_ack(content)
        return [Send(UP, self.codec.pack(P.ROUTE, content))]

    def _child_route(self, digit: int, content) -> List[Send]:
        add, remove = (content.get(k) if isinstance(content, dict) else None for k in ("add", "remove"))
        if not all(isinstance(x, list) and all(type(e) is int for e in x) for x in (add, remove)):
            raise P.ProtocolError("route announcement without engine id lists")
        self.routes.learn(digit, add, remove)
        if self.is_root:
            return self._route_ack(content)
        return [Send(UP, self.codec.pack(P.ROUTE, content))]

    def _route_ack(self, content) -> List[Send]:
        """The root saw a route: pass the acknowledgement down to its host relay."""
        to, host = content.get("to"), content.get("host")
        if self.host:
            token = content.get("token")
            joined = self._joining.pop(token, []) if isinstance(token, str) else []
            return [Send(JOINED, joined)] if joined else []
        if self.is_leaf:
            ident = host.encode() if isinstance(host, str) else None
            if ident not in self.children:
                return []  # an engine gone, or a host relay gone since
            return [Send(DOWN, [ident] + self.codec.pack(P.ROUTE_ACK, content))]
        if not isinstance(to, list) or len(to) <= len(self.path) or to[len(self.path)] not in self.idents:
            raise P.ProtocolError(f"route acknowledgement to a bad path {to!r}")
        return [Send(DOWN, [self.idents[to[len(self.path)]]] + self.codec.pack(P.ROUTE_ACK, content))]

    def _parent_ping(self, content) -> List[Send]:
        """Answer the parent; a parent that restarted hears our routes again."""
        boot = content.get("boot") if isinstance(content, dict) else None
        sends = self.hello()
        if isinstance(boot, str):
            known, self.parent_boot = self.parent_boot, boot
            if known is not None and known != boot:
                sends += self._host_announce() if self.host else self._announce(self.routes.announced(), [])
        return sends

    def _add_host(self, ident: bytes) -> bytes:
        """Leaf: a host relay said hello; it is a child from now on."""
        self.children[ident] = ident
        self.idents[ident] = ident
        self.child_names[ident] = f"host {ident[len(HOST_PREFIX):].decode(errors='replace')}"
        if self._next_ping is None and self.ping_interval:
            self._next_ping = self.clock()
        return ident

    def stats(self, trace=None) -> dict:
        """This node's own state, as a survey reports it; with ``trace`` (a
        request's msg_id), the events this node recorded for that request."""
        stats = dict(node=self.name, pending=len(self.pending), parked=len(self.parked),
                     surveys=len(self.surveys), dropped=self.dropped,
                     engines=self._engines_served() if self.is_leaf else None, **self.probe())
        if self.host:
            stats.update(host=self.host, eids=sorted(self.engines))
        elif self.is_leaf:
            stats["hosts"] = sorted(self.child_names[k][5:] for k in self.children)
        if trace is not None:
            events = self.traces.get(trace)
            if events is None:  # still in flight
                events = next((p.trace for p in self.pending.values() if p.msg_id == trace), None)
            stats["trace"] = list(events or [])
        return stats

    def _engines_served(self) -> int:
        if self.host:
            return len(self.engines)
        via = self.routes.via
        return sum(1 for e in self.engines if e not in via and self.shape.serves(self.path, e))

    def _serves(self, eid: int) -> bool:
        return eid in self.engines if self.host else self.routes.serves(eid)

    def _stamp(self, p: Pending, event: str, detail=None, at=None):
        if p.trace is not None:
            p.trace.append([event, self.wall() if at is None else at, detail])

    def on_child_lost(self, key: Key, why: str = "is unreachable") -> List[Send]:
        """A child (relay node or host relay) cannot answer: what waits on it fails."""
        node = self.child_names.get(key, repr(key))
        child = f"Host relay {node[5:]}" if isinstance(key, bytes) else f"Relay node {node}"
        sends = []
        for skey, survey in list(self.surveys.items()):
            if key in survey.owed:
                survey.owed.discard(key)
                survey.nodes.append(dict(node=node, error=f"{child[0].lower()}{child[1:]} {why}"))
                sends += self._survey_done(skey)
        return sends + self._fail_dest(
            key, P.UNREACHABLE,
            lambda eid: f"{child} {why}; engine {eid} did not answer",
        )

    def _forget_host(self, key: bytes):
        """A host relay gone for good, with no engine routed to it: drop it."""
        for table in (self.children, self.idents, self.child_names, self.heard, self.boots):
            table.pop(key, None)

    # --------------------------------------------------------------- liveness
    def _ping(self, now) -> List[Send]:
        self._next_ping = now + self.ping_interval
        sends = []
        ping = self.codec.pack(P.PING, dict(boot=self.boot))
        for ident, key in list(self.children.items()):
            if now - self.heard[key] > self.node_timeout:
                self.heard[key] = now  # one report per silent spell
                sends += self.on_child_lost(key, f"has not answered for {self.node_timeout:g} s")
                if isinstance(key, bytes) and key not in self.routes.via.values():
                    self._forget_host(key)
                    continue
            sends.append(Send(DOWN, [ident] + ping))
        if not self.children:
            self._next_ping = None
        return sends

    def _client_ping(self, route, content) -> List[Send]:
        """A client lists requests it waits on: answer with those not held here."""
        ids = content.get("ids") if isinstance(content, dict) else None
        if not isinstance(ids, list):
            raise P.ProtocolError("client ping without a list of ids")
        held = {p.msg_id for p in self.pending.values()} | {s.msg_id for s in self.surveys.values()}
        unknown = [m for m in ids if m not in held]
        return [Send(UP, route + self.codec.pack(P.PONG, dict(node=self.name, boot=self.boot, unknown=unknown)))]

    def _pong(self, digit, msg) -> List[Send]:
        try:
            boot = self.codec.session.unpack(P.as_bytes(msg["content"])).get("boot")
        except Exception as e:
            raise P.ProtocolError(f"bad pong: {e}") from e
        if not isinstance(boot, str):
            raise P.ProtocolError("pong without a boot id")
        known, self.boots[digit] = self.boots.get(digit), boot
        if known is not None and known != boot:
            return self.on_child_lost(digit, "restarted")
        return []

    # ----------------------------------------------------------------- survey
    def _survey(self, route, content) -> List[Send]:
        if not isinstance(content, dict):
            raise P.ProtocolError("stats request content is not a dict")
        key = f"s{next(self._keys)}" if self.is_root else content.get("req")
        if not isinstance(key, str) or key in self.surveys:
            raise P.ProtocolError("stats request without a usable key")
        owed = set(self.children.values())  # a leaf's: its host relays
        trace = content.get("trace")
        trace = trace if isinstance(trace, str) else None
        self.surveys[key] = Survey(route, content.get("msg_id"), owed, [self.stats(trace)])
        down = self.codec.pack(P.STATS, dict(req=key, trace=trace))
        return [Send(DOWN, [ident] + down) for ident in self.children] + self._survey_done(key)

    def _survey_reply(self, digit, msg) -> List[Send]:
        try:
            content = self.codec.session.unpack(P.as_bytes(msg["content"]))
        except Exception as e:
            raise P.ProtocolError(f"bad stats reply: {e}") from e
        key, nodes = content.get("req"), content.get("nodes")
        survey = self.surveys.get(key) if isinstance(key, str) else None
        if survey is None or digit not in survey.owed or not isinstance(nodes, list):
            raise P.ProtocolError(f"unexpected stats reply for {key!r}")
        survey.owed.discard(digit)
        survey.nodes.extend(n for n in nodes if isinstance(n, dict))
        return self._survey_done(key)

    def _survey_done(self, key) -> List[Send]:
        survey = self.surveys[key]
        if survey.owed:
            return []
        del self.surveys[key]
        reply = dict(req=key, msg_id=survey.msg_id, nodes=survey.nodes)
        return [Send(UP, survey.route + self.codec.pack(P.STATS_REPLY, reply))]

    # -------------------------------------------------------------- down path
    def _start(self, route, content, inner, compat=None, arrived=None) -> List[Send]:
        if compat is None:  # the client's own request: checked once, at the root
            if len(inner) < 5:
                raise P.ProtocolError(f"the request inside has {len(inner)} frames, needs 5")
            if self.is_root:
                self.codec.check_signature(inner[:5])
        key = f"r{next(self._keys)}" if self.is_root else content.get("req")
        if not isinstance(key, str) or key in self.pending:
            return self._drop(f"request key {key!r} missing or in use")
        mode = content.get("compat")
        rename = None
        if self.is_leaf and mode == CompatRequest.RENAME:  # may raise: before any state
            rename = renamer(self.codec, compat.msg if compat else inner)
        own = None
        if content.get("each") is not None:
            inner, own = P.split_each(inner, content["targets"], content["each"])
        op = content.get("reduce")
        p = self.pending[key] = Pending(
            key=key,
            msg_id=content["msg_id"],
            stream=content["reply"] == P.STREAM,
            route=route,
            inner=inner,
            compat=compat,
            rename=rename,
            raw=bool(mode) or not P.splices_json(self.codec),
            stock=bool(mode),
            own=own,
            batch=tuple(content["batch"]) if content.get("batch") else None,
            reduction=Reduction(op) if op else None,
            trace=[["request in", arrived, None]] if content.get("trace") is True else None,
        )
        targets = content["targets"]
        strays = [e for e in targets if not self._serves(e)]
        sends = self._fail(p, strays, P.UNREACHABLE, "was routed to the wrong subtree") if strays else []
        if strays:
            targets = [e for e in targets if self._serves(e)]
        groups = self.routes.split(targets) if not self.host else {None: targets}
        direct = groups.pop(None, None)
        if direct:
            sends += self._to_engines(p, direct)
        sends += self._to_children(p, groups, mode)
        self._stamp(p, "request out", len(sends))
        return sends + self._finish_if_done(p)

    def _to_children(self, p: Pending, groups: Dict[Key, List[int]], mode) -> List[Send]:
        """One request to each child (relay node or host relay) for its targets."""
        sends = []
        reply = P.STREAM if p.stream else P.COALESCE
        for key, sub in groups.items():
            p.waiting[key] = set(sub)
            content = P.request_content(p.msg_id, sub, reply, req=p.key)
            frames = p.inner
            if mode:
                content["compat"] = mode
            if p.own is not None:  # only this subtree's share goes down
                content["each"] = [len(p.own[e]) for e in sub]
                frames = p.inner + [f for e in sub for f in p.own.pop(e)]
            if p.batch:
                content["batch"] = list(p.batch)
            if p.reduction is not None:
                content["reduce"] = p.reduction.op
            if p.trace is not None:
                content["trace"] = True
            envelope = self.codec.pack(P.REQUEST, content, frames)
            sends.append(Send(DOWN, [self.idents[key]] + envelope))
        return sends

    def _to_engines(self, p: Pending, targets) -> List[Send]:
        sends, unknown = [], []
        key = p.key.encode()
        for eid in targets:
            uuid = self.engines.get(eid)
            if uuid is None:
                unknown.append(eid)
                continue
            p.waiting[uuid] = {eid}
            inner = p.rename(uuid) if p.rename else p.inner
            if p.own is not None:
                inner = inner + p.own.pop(eid)
            sends.append(Send(DOWN, [uuid.encode(), key, P._DELIM] + inner))
        if unknown and self.host:  # a host relay knows its engines: no hub to ask
            sends += self._fail(p, unknown, P.UNKNOWN, f"is not on {self.name}")
        elif unknown:
            p.waiting.setdefault(PARKED, set()).update(unknown)
            self.parked.add(p.key)
            sends.append(Send(HUB, []))
        return sends

    def _retry_parked(self, final: bool) -> List[Send]:
        sends = []
        for key in list(self.parked):
            self.parked.discard(key)
            p = self.pending.get(key)
            if p is None or PARKED not in p.waiting:
                continue
            eids = p.waiting.pop(PARKED)
            sends += self._to_engines(p, [e for e in eids if e in self.engines])
            left = sorted(e for e in eids if e not in self.engines)
            if left and final:
                sends += self._fail(p, left, P.UNKNOWN, "is not registered")
            elif left:
                p.waiting[PARKED] = set(left)
                self.parked.add(key)
            sends += self._finish_if_done(p)
        return [s for s in sends if s.socket != HUB]

    # ---------------------------------------------------------------- up path
    def _engine_reply(self, frames) -> List[Send]:
        idents, body = P.split_idents(frames)
        if len(idents) != 2:
            raise P.ProtocolError(f"engine reply with {len(idents)} idents")
        uuid, key = P.as_bytes(idents[0]).decode(), P.as_bytes(idents[1]).decode()
        p = self.pending.get(key)
        if p is None or uuid not in p.waiting:
            raise P.ProtocolError(f"unexpected reply from engine {uuid} to {key}")
        self.codec.check_signature(body)
        eids = sorted(p.waiting.pop(uuid))
        if p.trace is not None:  # the detail is formatted only for a traced request
            self._stamp(p, "reply in", f"engine {eids[0]}")
        copy = [Send(MON, [P.OUTBCAST, idents[0], P._DELIM] + body)] \
            if self.records and not p.stock else []
        if p.reduction is not None:
            self._reduce_reply(p, eids, body)
        elif p.stream:
            return copy + self._emit(p, [body], [], eids) + self._finish_if_done(p)
        else:
            p.parts.append(body)
        return copy + self._finish_if_done(p)

    def _reduce_reply(self, p: Pending, eids, body):
        """Fold an engine's value into the reduction; keep raised errors raw."""
        try:
            status = self.codec.session.unpack(P.as_bytes(body[4])).get("status")
        except Exception:
            status = None
        if status != "ok":
            p.raised.append(body)
            return
        try:
            p.reduction.add(eids, decode_engine(body[5:]))
        except ValueError as e:
            p.reduction.add_error(eids, f"reduce: engine {eids[0]} returned {e}")

    def _child_message(self, frames) -> List[Send]:
        """From a child node or host relay: a bundle, pong, survey reply or route."""
        idents, body = P.split_idents(frames)
        ident = P.as_bytes(idents[0]) if len(idents) == 1 else None
        digit = self.children.get(ident)
        msg = self.codec.unpack(body, content=False)  # results stay unparsed
        msg_type = msg["header"].get("msg_type")
        if digit is None:
            if not (self.is_leaf and ident.startswith(HOST_PREFIX) and msg_type in (P.PONG, P.HOST)):
                raise P.ProtocolError(f"message from unknown peer {idents!r}")
            digit = self._add_host(ident)
        self.heard[digit] = self.clock()
        if msg_type == P.PONG:
            return self._pong(digit, msg)
        if msg_type == P.STATS_REPLY:
            return self._survey_reply(digit, msg)
        if msg_type == P.HOST and isinstance(digit, bytes):
            return self._host_engines(digit, self._content(msg))
        if msg_type == P.ROUTE and isinstance(digit, int):
            return self._child_route(digit, self._content(msg))
        meta = msg["metadata"]
        if msg_type != P.BUNDLE or not isinstance(meta, dict):
            raise P.ProtocolError("expected a bundle from a child")
        req = meta.get("req")
        p = self.pending.get(req) if isinstance(req, str) else None
        if p is None or digit not in p.waiting:
            raise P.ProtocolError(f"unexpected bundle for {meta.get('req')!r}")
        if p.trace is not None:
            self._stamp(p, "reply in", f"node {self.child_names[digit]}")
        if p.reduction is not None:
            return self._reduce_bundle(p, digit, msg)
        # a host relay's engines' replies, for the hub's records (as a leaf copies its own)
        copy = [Send(MON, [P.OUTBUNDLE, digit, P._DELIM] + list(body))] \
            if self.records and isinstance(digit, bytes) and not p.stock else []
        if p.stream:
            eids = meta.get("eids")
            if not isinstance(eids, list) or not all(type(e) is int for e in eids) \
                    or not set(eids) <= p.waiting[digit] | p.settled:
                raise P.ProtocolError("streamed bundle names engines not owed")
            p.waiting[digit].difference_update(eids)
            if not p.waiting[digit]:
                del p.waiting[digit]
            return copy + self._forward(p, body, msg) + self._finish_if_done(p)
        del p.waiting[digit]
        (p.bundles if self.is_leaf else p.parts).append(msg if p.compat else body)
        return copy + self._finish_if_done(p)

    def _content(self, msg) -> dict:
        try:
            content = self.codec.session.unpack(P.as_bytes(msg["content"]))
        except Exception as e:
            raise P.ProtocolError(f"unreadable content: {e}") from e
        if not isinstance(content, dict):
            raise P.ProtocolError("content is not a dict")
        return content

    def _reduce_bundle(self, p: Pending, digit, msg) -> List[Send]:
        if msg["metadata"].get("kind") != "reduced":
            raise P.ProtocolError("expected a reduced bundle")
        try:
            msg["content"] = self.codec.session.unpack(P.as_bytes(msg["content"]))
            state, value, raised, failed = P.reduced_parts(msg)
            p.reduction.add_partial(state, value)
        except (ValueError, TypeError, AttributeError) as e:
            raise P.ProtocolError(f"bad reduced bundle: {e}") from e
        del p.waiting[digit]
        p.raised.extend(raised)
        p.failed.extend(failed)
        return self._finish_if_done(p)

    def _fail(self, p: Pending, eids, code, reason) -> List[Send]:
        failed = [[e, self.engines.get(e), f"Engine {e} {reason}", code] for e in eids]
        return self._record_failures(p, failed)

    def _record_failures(self, p: Pending, failed) -> List[Send]:
        if not failed:
            return []
        if p.stream:
            return self._emit(p, [], failed, [f[0] for f in failed])
        p.failed.extend(failed)
        return []

    def _fail_via(self, host: bytes, eid: int, uuid: str, code, message) -> List[Send]:
        """Fail one engine that a host relay owes, here (the relay may still
        answer for it later: that outcome then comes twice, and is tolerated)."""
        sends = []
        for p in list(self.pending.values()):
            owed = p.waiting.get(host)
            if owed and eid in owed:
                owed.discard(eid)
                if not owed:
                    del p.waiting[host]
                p.settled.add(eid)
                sends += self._record_failures(p, [[eid, uuid, message, code]])
                sends += self._finish_if_done(p)
        return sends

    def _fail_dest(self, dest, code, message: Callable[[int], str]) -> List[Send]:
        sends = []
        for p in list(self.pending.values()):
            eids = p.waiting.pop(dest, None)
            if eids:
                uuid = dest if isinstance(dest, str) else None
                failed = [[e, uuid or self.engines.get(e), message(e), code] for e in sorted(eids)]
                sends += self._record_failures(p, failed) + self._finish_if_done(p)
        return sends

    def _finish_if_done(self, p: Pending) -> List[Send]:
        if p.waiting or self.pending.get(p.key) is not p:
            return []
        del self.pending[p.key]
        self.parked.discard(p.key)
        sends = self._flush(p) if p.stream else self._deliver(p, p.parts, p.failed, None)
        if p.trace is not None:
            self.traces[p.msg_id] = p.trace
            while len(self.traces) > self.traces_kept:
                self.traces.popitem(last=False)
        return sends

    def _emit(self, p: Pending, parts, failed, eids) -> List[Send]:
        """Streaming: send outcomes up now, or hold them for the leaf's batch."""
        if not (self.is_leaf and p.batch):
            return self._deliver(p, parts, failed, eids)
        for held, new in zip(p.held, (parts, failed, eids)):
            held.extend(new)
        count_, interval = p.batch
        if len(p.held[2]) >= count_:
            return self._flush(p)
        if p.deadline is None and interval is not None:
            p.deadline = self.clock() + interval
        return []

    def _flush(self, p: Pending) -> List[Send]:
        parts, failed, eids = p.held
        p.held, p.deadline = [[], [], []], None
        return self._deliver(p, parts, failed, sorted(eids)) if eids else []

    def _deliver(self, p: Pending, parts, failed, eids, kind=None) -> List[Send]:
        """Send outcomes up: a bundle, or stock replies to a stock client."""
        sends = self._pack_up(p, parts, failed, eids, kind)
        self._stamp(p, "reply out", len(parts) + len(failed))
        return sends

    def _pack_up(self, p: Pending, parts, failed, eids, kind=None) -> List[Send]:
        kind = kind or self.kind
        if p.reduction is not None:
            state, frames = p.reduction.state()
            body = P.pack_reduced(self.codec, p.key, p.msg_id, state, frames, p.raised, failed)
            return [Send(UP, p.route + [P._DELIM] + body)]
        if p.bundles and kind == "engines":  # a leaf with host relays: its own engines nest too
            parts = ([self._own_bundle(p, parts)] if parts else []) + p.bundles
            kind = "bundles"
        if p.compat is not None:
            bodies = p.compat.replies(self.codec, kind, parts, failed)
            return [Send(UP, p.route + [P._DELIM] + b) for b in bodies]
        if kind == "engines" and not p.raw:
            body = P.pack_replies(self.codec, p.key, p.msg_id, parts, failed, eids)
        else:
            body = P.pack_bundle(self.codec, p.key, p.msg_id, kind, parts, failed, eids)
        return [Send(UP, p.route + [P._DELIM] + body)]

    def _own_bundle(self, p: Pending, parts):
        """A leaf's direct engines' replies as one nested bundle (parsed, for a
        stock client's root)."""
        if p.raw:
            body = P.pack_bundle(self.codec, p.key, p.msg_id, "engines", parts, [])
        else:
            body = P.pack_replies(self.codec, p.key, p.msg_id, parts, [])
        return self.codec.unpack(body) if p.compat is not None else body

    def _forward(self, p: Pending, body, msg) -> List[Send]:
        """Pass a child's streamed bundle up unchanged."""
        self._stamp(p, "reply out", "forwarded")
        if p.compat is not None:
            return self._deliver(p, [msg], [], None, "bundles")
        return [Send(UP, p.route + [P._DELIM] + body)]

    def _drop(self, why: str) -> List[Send]:
        self.dropped += 1
        log.warning("relay node %s dropped a message: %s", self.name, why)
        return []
