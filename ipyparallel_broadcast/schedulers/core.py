"""The relay node as a pure state machine: frames and events in, sends out.

One ``RelayNode`` sits at each tree position, and one on each engine host (a
host relay). It never touches a socket: ``on_up`` / ``on_down`` / ``on_hub``
take the frames a socket received (parsed once, by ``events``), the other
``on_*`` methods what the shell learned, and each returns the ``Send`` list
the shell performs. Its parts: ``routes`` (where engines are), ``liveness``
(children alive), ``surveys`` (stats), ``pending`` (requests in flight and how
their outcomes are packed) and ``reduction`` (folding values).
"""

from __future__ import annotations

import logging
import time
import uuid as uuidlib
from itertools import count
from typing import Callable, Dict, List, Optional

from .. import bundles as B
from .. import protocol as P
from ..reduction import Reduction, fold_bundle, fold_reply
from ..topology import HOST_PREFIX, Path, TreeShape, node_name
from . import events as E
from .bulk import Bulk, Incoming
from .compat import CompatRequest, renamer
from .events import DOWN, HUB, MON, PULSE, UP, Send
from .liveness import Children
from .pending import PARKED, InFlight, Pending
from .routes import Announcements, Key, Routes
from .sharing import HELLO_KEY, Sharing
from .surveys import Surveys, own_trace

log = logging.getLogger(__name__)
BULK_WAIT = "~bulk"  # waiting-table key: targets whose request waits for its chunks


class RelayNode:
    """Routing, fan-out and coalescing for one node of the tree."""

    def __init__(self, codec: P.Codec, shape: TreeShape, path: Path = (),
                 clock: Callable[[], float] = time.monotonic,
                 ping_interval: float = 0.5, node_timeout: float = 10.0,
                 wall: Callable[[], float] = time.time, host: Optional[str] = None, store=None,
                 bulk: Optional[dict] = None):
        self.codec, self.clock, self.shape = codec, clock, shape
        self.wall = wall  # trace timestamps: comparable across processes
        self.path = tuple(path)  # a host relay: its leaf's
        self.host = host  # a host relay's label: it serves the engines that joined it
        self.name = f"host {host}" if host else node_name(self.path)
        self.is_root = not self.path and not host
        self.is_leaf = bool(host) or shape.is_leaf(self.path)
        self.kind = "engines" if self.is_leaf else "bundles"
        self.boot = uuidlib.uuid4().hex  # this process's life: a restart changes it
        self.ping_interval, self.node_timeout = ping_interval, node_timeout
        self.children = Children(self.path, [] if self.is_leaf else range(shape.fanout),
                                 clock, ping_interval, node_timeout)
        self.routes = Routes(shape, self.path, self.is_leaf)
        self.announce = Announcements(codec, self.routes, self.children.idents, self.is_root, host, self.boot)
        self.surveys = Surveys(codec)
        self.parent_boot: Optional[str] = None  # a new one: the parent restarted
        self.pulse_port: Optional[int] = None  # the shell's pulse link for host relays, if bound
        self.parent_pulse: Optional[int] = None  # host relay: the parent's pulse port, once told
        # host relay: when its leaf last pinged it. A leaf that restarted does
        # not know its host relays; each says hello again when its leaf is silent
        self.parent_heard: Optional[float] = clock() if host else None
        self.parent_silence = min(node_timeout, 3 * ping_interval)  # three pings missed
        self.inflight = InFlight(codec, self.kind, self.is_leaf, clock, wall)
        self.pending, self.parked = self.inflight.requests, self.inflight.parked  # key -> Pending
        self.engines: Dict[int, str] = {}  # leaf: engine id -> uuid
        self.sharing = Sharing(codec, store)  # big buffers, once per host
        self.bulk = Bulk(codec, clock, 2 * node_timeout, **(bulk or {}))  # ... to hosts, in chunks
        self.bulk_url: Optional[str] = None  # a host relay's bulk socket, said in its pongs
        if self.sharing.on:  # chunks are written straight into the segment engines map
            self.bulk.reserve, self.bulk.discard = self.sharing.store.reserve, self.sharing.store.drop
        self.inflight.on_done = self._done
        self.dropped = 0  # messages dropped as malformed or unexpected
        self.probe: Callable[[], dict] = dict  # the shell adds process facts (RSS)
        # a restarted root must not reuse the keys of requests engines may still answer
        self._keys = count(int(self.boot[:8], 16) << 20)
        self._records = False

    @property
    def records(self) -> bool:
        """Copies to the hub's task records (MON): the root copies each request
        and each bundle it sends up (one copy per host bundle at most); a leaf,
        each engine's reply to a reduction (the bundles carry only the combined value)."""
        return self._records

    @records.setter
    def records(self, on: bool):
        self._records = on
        self.inflight.records = on and self.is_root

    # ------------------------------------------------------------------ events
    def on_up(self, frames) -> List[Send]:
        """From above: a client's request or ping (root), or the parent's."""
        arrived = self.wall()
        try:
            event = E.from_above(self.codec, frames, self.is_root, bool(self.host))
            if isinstance(event, E.Request):
                dropped = self.dropped
                sends = self._start(event.route, event.content, event.inner, arrived=arrived)
                if self.records and self.is_root and self.dropped == dropped:  # taken: filed
                    inner_buffers = len(event.inner) - 5  # the user's data: kept out of the hub
                    sends.insert(0, Send(MON, [P.INBCAST] + P.strip_big(event.frames, inner_buffers)))
                return sends
            if isinstance(event, E.StockRequest):
                return self._start(event.route, event.compat.content, event.compat.inner, event.compat)
            if isinstance(event, E.StatsRequest):
                key = f"s{next(self._keys)}" if self.is_root else event.content.get("req")
                own = self.stats(own_trace(event.content))
                return self.surveys.start(key, event.route, event.content, self.children.idents, own)
            if isinstance(event, E.Ping):
                return self._client_ping(event) if self.is_root else self._parent_ping(event.content)
            if isinstance(event, E.RouteAck):
                return self.announce.ack(event.content)
            return self.on_engine_lost(event.uuid, event.why)  # E.Lost
        except P.ProtocolError as e:
            return self._drop(f"request: {e}")

    def on_down(self, frames) -> List[Send]:
        """From below: an engine's reply, or a child node's or host relay's message."""
        try:
            event = E.from_below(self.codec, frames, self.is_leaf)
            if isinstance(event, E.EngineReply):
                return self._engine_reply(event)
            return self._child_message(event)
        except P.ProtocolError as e:
            return self._drop(f"reply: {e}")

    def on_hub(self, frames) -> List[Send]:
        """A leaf's news from the hub: engines registered or lost, or its registry."""
        try:
            event = E.from_hub(self.codec, frames)
        except P.ProtocolError as e:
            return self._drop(f"hub: {e}")
        if isinstance(event, E.EngineRegistered):
            return self.on_engine_registered(event.eid, event.uuid)
        if isinstance(event, E.EngineUnregistered):
            return self.on_engine_lost(event.uuid, P.DIED)
        if isinstance(event, E.Registry):
            return self.on_registry(event.engines)
        return []

    def on_engine_registered(self, eid: int, uuid: str) -> List[Send]:
        self.engines[eid] = uuid
        return self._greet([eid]) + self._retry_parked(final=False)

    def on_registry(self, engines: Dict[int, str]) -> List[Send]:
        """The hub's full engine table. Parked targets still unknown fail."""
        self.engines = dict(engines)
        return self._greet(self.engines) + self._retry_parked(final=True)

    def on_engine_lost(self, uuid: str, why: str = P.DIED) -> List[Send]:
        """An engine can no longer answer: ``why`` is ``P.DIED`` (the hub
        unregistered it) or a phrase such as "is not connected". An engine
        behind a host relay is failed by that relay, told here; here too if
        the relay has fallen silent (a host cut off)."""
        eid = next((e for e, u in self.engines.items() if u == uuid), None)
        host = self.routes.via.get(eid)
        self.sharing.forget(uuid)
        if why == P.DIED:
            self.engines = {e: u for e, u in self.engines.items() if u != uuid}
            if host is not None:
                self.routes.host_lost_engine(eid)
        code = P.DIED if why == P.DIED else P.UNREACHABLE
        if host is None or host not in self.children:
            sends = self._fail_dest(uuid, code, lambda eid: f"Engine {eid} {why} before replying")
            if self.host and why == P.DIED:  # alive, maybe, but the hub will not take it back
                sends.append(Send(DOWN, [uuid.encode()] + self.codec.pack(P.DROPPED, {})))
            return sends
        sends = [Send(DOWN, [host] + self.codec.pack(P.LOST, dict(uuid=uuid, why=why)))]
        if why == P.DIED:
            sends += self.announce.up([], [eid])
        silent = self.clock() - self.children.heard[host]
        if silent > 2 * self.ping_interval:
            where = self.children.names[host]
            sends += self.inflight.fail_via(host, eid, [eid, uuid, f"Engine {eid} on {where} {why} before "
                                            f"replying (its host relay silent for {silent:.1f} s)", code])
        return sends

    def on_join(self, eid: int, uuid: str, who=None, shm=None) -> List[Send]:
        """Host relay: an engine on this host joined (again), with its
        shared-memory identity. Its leaf learns all of them; once the root has
        the route, ``Send(JOINED, [who, ...])``."""
        self.engines[eid] = uuid
        sends = self.announce.host_engines(self.engines, [who] if who is not None else [])
        return sends + (self.sharing.joined(uuid, shm) if shm is not None else self._greet([eid]))

    def on_child_lost(self, key: Key, why: str = "is unreachable") -> List[Send]:
        """A child (relay node or host relay) cannot answer: what waits on it fails."""
        child = self.children.phrase(key)
        sends = self.surveys.child_lost(key, self.children.names.get(key, repr(key)),
                                        f"{child[0].lower()}{child[1:]} {why}")
        sends += self._fail_dest(key, P.UNREACHABLE, lambda eid: f"{child} {why}; engine {eid} did not answer")
        if isinstance(key, bytes):  # the hosts it fed chunks to get them from here
            sends += self.bulk.orphaned(key)
        if isinstance(key, bytes) and key not in self.routes.via.values():
            self.children.forget(key)  # a host relay gone, with no engine routed to it
        return sends

    def on_tick(self) -> List[Send]:
        """Time passed: send up batches whose interval is over; ping children."""
        now = self.clock()
        sends = self.inflight.due(now) + self._stalled(now)
        if self.children.next_ping is not None and self.children.next_ping <= now:
            sends += self._ping(now)
        if self.parent_heard is not None and now - self.parent_heard >= self.parent_silence:
            self.parent_heard = now  # again after as long, until a ping comes
            sends += self.hello() + self.announce.again(self.engines)
        return sends

    def on_drained(self) -> List[Send]:
        """The shell has read every message waiting on its sockets: streamed
        outcomes held meanwhile go up now (``InFlight.coalesce``)."""
        return self.inflight.drained()

    def next_deadline(self) -> Optional[float]:
        """When ``on_tick`` next has something to do (``None``: nothing timed)."""
        silence = None if self.parent_heard is None else self.parent_heard + self.parent_silence
        times = [t for t in (self.inflight.next_deadline(), self.children.next_ping, self.bulk.next_deadline(),
                             silence) if t is not None]
        return min(times, default=None)

    def hello(self) -> List[Send]:
        """Tell the parent this node is alive, and which life of it this is."""
        if self.is_root:
            return []
        return [Send(UP, self.codec.pack(P.PONG, dict(node=self.name, boot=self.boot, bulk=self.bulk_url)))]

    def stats(self, trace=None) -> dict:
        """This node's own state, as a survey reports it; with ``trace`` (a
        request's msg_id), the events this node recorded for that request."""
        stats = dict(node=self.name, pending=len(self.pending), parked=len(self.parked),
                     surveys=len(self.surveys), dropped=self.dropped, signatures=self.codec.remembered,
                     engines=self._engines_served() if self.is_leaf else None, **self.probe())
        if self.sharing.on:
            stats.update(self.sharing.stats())
        stats.update(self.bulk.stats())
        if self.host:
            stats.update(host=self.host, eids=sorted(self.engines))
        elif self.is_leaf:
            stats["hosts"] = self.children.host_labels()
        if trace is not None:
            stats["trace"] = self.inflight.trace_of(trace)
        return stats

    # --------------------------------------------------------------- liveness
    def _ping(self, now) -> List[Send]:
        sends = []
        for key in self.children.silent(now):
            sends += self.on_child_lost(key, f"has not answered for {self.node_timeout:g} s")
        ping = self.codec.pack(P.PING, dict(boot=self.boot, pulse=self.pulse_port))
        sends += [Send(DOWN, [ident] + ping) for ident in self.children.idents.values()]
        if self.children.pulsing:  # signed apart: the same message twice would be a replay
            ping = self.codec.pack(P.PING, dict(boot=self.boot, pulse=self.pulse_port))
            sends += [Send(PULSE, [self.children.idents[k]] + ping) for k in self.children.pulsing]
        self.children.after_pings()
        return sends

    def on_pulse(self, frames) -> List[Send]:
        """A host relay's pong on the pulse link (see ``liveness``)."""
        try:
            event = E.from_below(self.codec, frames, False)
            key = self.children.key_of(event.ident) if isinstance(event, E.ChildMessage) else None
            if not isinstance(key, bytes) or event.kind != P.PONG:
                raise P.ProtocolError("only pongs of known host relays come on the pulse link")
            self.children.pulsing.add(key)
            return self._child_message(event)
        except P.ProtocolError as e:
            return self._drop(f"pulse: {e}")

    def on_parent_pulse(self, frames) -> List[Send]:
        """A ping on the pulse link (a host relay's): the pong goes back that way."""
        try:
            event = E.from_above(self.codec, frames, self.is_root, bool(self.host))
            if not isinstance(event, E.Ping) or self.is_root:
                raise P.ProtocolError("only pings come on the pulse link")
            return self._parent_ping(event.content, via=PULSE)
        except P.ProtocolError as e:
            return self._drop(f"pulse: {e}")

    def _client_ping(self, event: E.Ping) -> List[Send]:
        """A client lists requests it waits on: answer with those not held here."""
        ids = event.content.get("ids")
        if not isinstance(ids, list):
            raise P.ProtocolError("client ping without a list of ids")
        held = {p.msg_id for p in self.pending.values()} | self.surveys.msg_ids()
        pong = dict(node=self.name, boot=self.boot, unknown=[m for m in ids if m not in held])
        return [Send(UP, event.route + self.codec.pack(P.PONG, pong))]

    def _parent_ping(self, content, via=UP) -> List[Send]:
        """Answer the parent; a parent that restarted hears our routes again."""
        boot, sends = content.get("boot"), [Send(via, s.frames) for s in self.hello()]
        if self.parent_heard is not None:
            self.parent_heard = self.clock()
        pulse = content.get("pulse")
        if self.host and type(pulse) is int and 0 < pulse < 65536 and pulse != self.parent_pulse:
            self.parent_pulse = pulse  # the shell connects to it; a pong says who we are there
            sends += [Send(PULSE, s.frames) for s in self.hello()]
        if isinstance(boot, str):
            known, self.parent_boot = self.parent_boot, boot
            if known is not None and known != boot:
                sends += self.announce.again(self.engines)
        return sends

    def _greet(self, eids) -> List[Send]:
        """Ask engines served here (not through a host relay) whether they share our memory."""
        return self.sharing.greet([self.engines[e] for e in eids if e in self.engines
                                   and e not in self.routes.via and self._serves(e)])

    def _engines_served(self) -> int:
        if self.host:
            return len(self.engines)
        via = self.routes.via
        return sum(1 for e in self.engines if e not in via and self.shape.serves(self.path, e))

    def _serves(self, eid: int) -> bool:
        return eid in self.engines if self.host else self.routes.serves(eid)

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
            key=key, msg_id=content["msg_id"], stream=content["reply"] == P.STREAM,
            route=route, inner=inner, compat=compat, rename=rename,
            raw=bool(mode) or not B.splices_json(self.codec), stock=bool(mode), own=own,
            batch=tuple(content["batch"]) if content.get("batch") else None,
            reduction=Reduction(op) if op else None,
            trace=[["request in", arrived, None]] if content.get("trace") is True else None,
        )
        targets = content["targets"]
        p.n = len(targets)
        if content.get("shm") is not None and not self.is_root:  # big buffers in this host's memory
            try:
                self.sharing.take(p, content["shm"])
            except (OSError, P.ProtocolError) as e:  # shm.ShmError: the segment is gone
                return self._fail(p, targets, P.UNREACHABLE, f"cannot get the request's buffers: {e}") \
                    + self.inflight.finish_if_done(p)
        elif not self.is_leaf and not mode:
            self.sharing.pass_down(p)
        if self.is_root:  # everything is under the root, but for engines whose route went
            strays = [e for e in targets if e in self.routes.departed] if self.routes.departed else []
        else:
            strays = [e for e in targets if not self._serves(e)]
        sends = self._fail_strays(p, strays) if strays else []
        if strays:
            gone = set(strays)
            targets = [e for e in targets if e not in gone]
        if content.get("bulk") is not None and self.host:  # its big buffers come in chunks
            return sends + self._expect_bulk(p, content["bulk"], targets)
        return sends + self._dispatch(p, targets, mode)

    def _dispatch(self, p: Pending, targets, mode=None) -> List[Send]:
        """Send ``p`` on: to engines served here, and one request to each child for its targets."""
        groups = self.routes.split(targets) if not self.host else {None: targets}
        direct = groups.pop(None, None)
        sends = self._to_engines(p, direct) if direct else []
        hosts = [(c, self.children.bulk[c]) for c in groups if c in self.children.bulk]
        out = self.bulk.start(p, hosts, self.boot) if hosts and not mode else None
        for child, sub in groups.items():
            p.waiting[child] = set(sub)
            same_host = isinstance(child, int)  # a relay of this tree, not a host relay
            content, frames = p.request_for(sub, mode, p.shared if same_host else None)
            if out is not None and child in out.urls:  # its big buffers come in chunks
                content["bulk"], frames = self.bulk.envelope(out, child, frames)
            sends.append(Send(DOWN, [self.children.idents[child]] + self.codec.pack(P.REQUEST, content, frames)))
        if out is not None:
            sends += self.bulk.sends_for(out, out.tree[None])
        self.inflight.stamp(p, "request out", len(sends))
        return sends + self.inflight.finish_if_done(p)

    # ------------------------------------------------------------- chunks
    def on_chunk(self, frames) -> List[Send]:
        """A host relay: a chunk of a big request, from the host or leaf that feeds it (``bulk``)."""
        try:
            sends, inc = self.bulk.on_chunk(frames)
        except P.ProtocolError as e:
            return self._drop(f"chunk: {e}")
        return sends + (self._bulk_complete(inc) if inc is not None else [])

    def _expect_bulk(self, p: Pending, content, targets) -> List[Send]:
        p.waiting[BULK_WAIT] = set(targets)  # not done before its data came
        inc, sends = self.bulk.expect(p, content, len(p.inner) - 5)
        return sends + (self._bulk_complete(inc) if inc.complete else [])

    def _bulk_complete(self, inc: Incoming) -> List[Send]:
        """Every chunk is here and checked: the request goes to the engines."""
        p, buffers, ref = self.pending.get(inc.key), inc.buffers, inc.ref
        adopted = p is not None and BULK_WAIT in p.waiting
        self.bulk.finished(inc, adopted)
        if not adopted:
            return []
        inner = list(p.inner)
        for (i, _), buf in zip(inc.layout.bufs, buffers):
            inner[5 + i] = buf
        p.inner = inner
        if ref is not None:
            self.sharing.adopt(p, ref, [(i, buf) for (i, _), buf in zip(inc.layout.bufs, buffers)])
        self.inflight.stamp(p, "chunks in", inc.layout.n)
        return self._dispatch(p, sorted(p.waiting.pop(BULK_WAIT)))

    def _stalled(self, now) -> List[Send]:
        sends = []
        for inc in self.bulk.stalled(now):
            p = self.pending.get(inc.key) if inc.key is not None else None
            if p is not None and BULK_WAIT in p.waiting:
                why = (f"did not get the request's data: {len(inc.have)} of {inc.layout.n} chunks came, "
                       f"then none for {self.bulk.stall:g} s")
                sends += self._fail(p, sorted(p.waiting.pop(BULK_WAIT)), P.UNREACHABLE, why)
                sends += self.inflight.finish_if_done(p)
        return sends

    def _done(self, p: Pending):
        self.sharing.release(p)
        self.bulk.done(p.key)

    def _to_engines(self, p: Pending, targets) -> List[Send]:
        sends, unknown = [], []
        key = p.key.encode()
        self.sharing.prepare(p, targets, self.engines)
        for eid in targets:
            uuid = self.engines.get(eid)
            if uuid is None:
                unknown.append(eid)
                continue
            p.waiting[uuid] = {eid}
            own = p.own.pop(eid) if p.own is not None else []
            frames = self.sharing.frames_for(p, uuid, key)
            if frames is None:
                inner = p.rename(uuid) if p.rename else p.inner
                frames = P.to_engine(uuid, key, inner + own if own else inner)
            elif own:
                frames = frames + own
            sends.append(Send(DOWN, frames))
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
            sends += self.inflight.finish_if_done(p)
        return [s for s in sends if s.socket != HUB]

    # ---------------------------------------------------------------- up path
    def _engine_reply(self, reply: E.EngineReply) -> List[Send]:
        greetings = self.sharing.on_reply(reply.uuid, reply.key, reply.body) if self.sharing.on else []
        if reply.key == HELLO_KEY:
            return greetings
        p = self.pending.get(reply.key)
        if p is None or reply.uuid not in p.waiting:
            raise P.ProtocolError(f"unexpected reply from engine {reply.uuid} to {reply.key}")
        eids, body = sorted(p.waiting.pop(reply.uuid)), reply.body
        if p.trace is not None:  # the detail is formatted only for a traced request
            self.inflight.stamp(p, "reply in", f"engine {eids[0]}")
        copy = [Send(MON, P.record_copy(P.OUTBCAST, reply.ident, body))] \
            if self.records and p.reduction is not None else []
        if p.reduction is not None:
            if not fold_reply(p.reduction, eids, body, self.codec):
                p.raised.append(body)
        elif p.stream:
            return greetings + copy + self.inflight.emit(p, [body], [], eids) + self.inflight.finish_if_done(p)
        else:
            p.parts.append(body)
        return greetings + copy + self.inflight.finish_if_done(p)

    def _child_message(self, m: E.ChildMessage) -> List[Send]:
        """From a child node or host relay: a bundle, pong, survey reply or route."""
        child = self.children.key_of(m.ident)
        if child is None:
            if not (self.is_leaf and m.ident.startswith(HOST_PREFIX) and m.kind in (P.PONG, P.HOST)):
                raise P.ProtocolError(f"message from unknown peer {m.ident!r}")
            child = self.children.add_host(m.ident)
        self.children.spoke(child)
        if m.kind == P.PONG:
            content = m.content(self.codec)
            boot, bulk = content.get("boot"), content.get("bulk")
            if not isinstance(boot, str):
                raise P.ProtocolError("pong without a boot id")
            if isinstance(child, bytes):
                self.children.bulk_link(child, bulk)
            return self.on_child_lost(child, "restarted") if self.children.pong(child, boot) else []
        if m.kind == P.STATS_REPLY:
            return self.surveys.reply(child, m.content(self.codec))
        if m.kind == P.HOST and isinstance(child, bytes):
            eids, sends = self.announce.from_host(child, m.content(self.codec))
            for eid, uuid in eids.items():  # before the hub's notification, maybe
                self.engines.setdefault(eid, uuid)
            return sends
        if m.kind == P.ROUTE and isinstance(child, int):
            return self.announce.from_child(child, m.content(self.codec))
        return self._child_bundle(child, m)

    def _child_bundle(self, child: Key, m: E.ChildMessage) -> List[Send]:
        meta = m.msg["metadata"]
        if m.kind != P.BUNDLE or not isinstance(meta, dict):
            raise P.ProtocolError("expected a bundle from a child")
        req = meta.get("req")
        p = self.pending.get(req) if isinstance(req, str) else None
        if p is None or child not in p.waiting:
            raise P.ProtocolError(f"unexpected bundle for {req!r}")
        if p.trace is not None:
            self.inflight.stamp(p, "reply in", f"node {self.children.names[child]}")
        if p.reduction is not None:
            raised, failed = fold_bundle(p.reduction, m.msg, self.codec)
            del p.waiting[child]
            p.raised.extend(raised)
            p.failed.extend(failed)
            return self.inflight.finish_if_done(p)
        if p.stream:
            eids = meta.get("eids")
            if not isinstance(eids, list) or not all(type(e) is int for e in eids) \
                    or not set(eids) <= p.waiting[child] | p.settled:
                raise P.ProtocolError("streamed bundle names engines not owed")
            p.waiting[child].difference_update(eids)
            if not p.waiting[child]:
                del p.waiting[child]
            return self.inflight.forward(p, m.msg, m.body) + self.inflight.finish_if_done(p)
        del p.waiting[child]
        (p.bundles if self.is_leaf else p.parts).append(m.msg if p.compat else m.body)
        return self.inflight.finish_if_done(p)

    def _fail_strays(self, p: Pending, strays) -> List[Send]:
        """Targets not under this node: engines whose route went as they died
        (the request was on its way), or routed here by mistake."""
        departed = self.routes.departed
        dead = [e for e in strays if e in departed]
        other = [e for e in strays if e not in departed]
        sends = self._fail(p, dead, P.DIED, "died (it was unregistered) before replying") if dead else []
        return sends + (self._fail(p, other, P.UNREACHABLE, "was routed to the wrong subtree") if other else [])

    def _fail(self, p: Pending, eids, code, reason) -> List[Send]:
        failed = [[e, self.engines.get(e), f"Engine {e} {reason}", code] for e in eids]
        return self.inflight.record_failures(p, failed)

    def _fail_dest(self, dest, code, message: Callable[[int], str]) -> List[Send]:
        uuid = dest if isinstance(dest, str) else None
        return self.inflight.fail_dest(dest, lambda e: [e, uuid or self.engines.get(e), message(e), code])

    def _drop(self, why: str) -> List[Send]:
        self.dropped += 1
        log.warning("relay node %s dropped a message: %s", self.name, why)
        return []
