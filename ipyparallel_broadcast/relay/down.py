"""A request's way down a relay node, a part that owns its flow: split
among children or sent to engines, parked while its engines are not known
yet, and, for big buffers, waiting for its chunks (``dataplane.push``).
Sans I/O; it reaches the node only through what it is given."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from functools import partial

from ..wire import bundles as B
from ..wire import protocol as P
from ..wire.reduction import Reduction, RingValue, assign_request, buffer_of
from . import forwarding
from .chunks_in import ChunksIn
from .dataplane import plans
from .events import DOWN, HUB, Send
from .flow import FlowParts
from .inflight import Pending
from .state import PARKED
from .stock import CompatRequest, renamer

log = logging.getLogger("ipyparallel_broadcast.relay.node")


class DownFlow:
    """A request's way down: to children, or to engines. Given: the node's
    ``FlowParts``, the request keys of a root, and the size from which a
    buffer is big."""

    def __init__(self, parts: FlowParts, *, wall: Callable[[], float], keys: Iterator[int], big_from: int):
        ctx = parts.ctx
        self.codec, self.name, self.boot, self.is_root = ctx.codec, ctx.name, ctx.boot, ctx.is_root
        self.host, self.drop, self.is_leaf, self.wall = ctx.host, ctx.drop, parts.is_leaf, wall
        self._keys, self.big_from = keys, big_from  # (a root's request keys; a big buffer's size)
        self.inflight = parts.inflight
        self.engines, self.routes, self.children = parts.engines, parts.routes, parts.children
        self.sharing, self.big, self.forwarding = parts.sharing, parts.big, parts.forwarding
        self.chunks_in = ChunksIn(ctx, self.inflight, self.sharing, self.big, go_on=self._dispatch)  # (a host's)

    def start(self, route, content, inner, compat=None, arrived=None, value_at=None) -> list[Send]:
        if compat is None:  # the client's own request: checked once, at the root
            if len(inner) < 5:
                raise P.ProtocolError(f"the request inside has {len(inner)} frames, needs 5")
            if self.is_root:
                self.codec.check_signature(inner[:5])
        key = f"r{next(self._keys)}" if self.is_root else content.get("req")
        if not isinstance(key, str) or key in self.inflight:
            return self.drop(f"request key {key!r} missing or in use")
        mode = content.get("compat")
        passing = forwarding.parse(content[forwarding.FORWARD]) if self.host and forwarding.FORWARD in content else ()
        rename = None
        if self.is_leaf and mode == CompatRequest.RENAME:  # may raise: before any state
            rename = renamer(self.codec, compat.msg if compat else inner)
        own = None
        if content.get("each") is not None:
            inner, own = P.split_each(inner, content["targets"], content["each"])
        op = content.get("reduce")
        bound = None
        if self.host and op and content.get("ring") is not None:  # its big value goes round the hosts
            self.big.rings.join(key, content["msg_id"], op, content["ring"])
        elif self.host and isinstance(content.get("ring_bind"), str):  # ... and is bound, from here
            bound = self.big.reduce_rings.bound(content)
            if bound is not None:
                inner, value_at = bound
        p = self.inflight.open(
            key,
            msg_id=content["msg_id"],
            stream=content["reply"] == P.STREAM,
            route=route,
            inner=inner,
            compat=compat,
            rename=rename,
            raw=bool(mode) or not B.splices_json(self.codec),
            stock=bool(mode),
            own=own,
            batch=tuple(content["batch"]) if content.get("batch") else None,
            reduction=Reduction(op) if op else None,
            quiet=content.get("quiet") is True,
            trace=[["request in", arrived, None]] if content.get("trace") is True else None,
        )
        targets = content["targets"]
        p.n = len(targets) + sum(len(f.owed) for f in passing)
        if p.reduction is not None and not self.host:  # its value may go up by a segment's name
            p.share_up = self.sharing.passer(content.get("vshm"), client=self.is_root)
        if self.is_root and content.get("allreduce") is not None:
            p.then = partial(self._assign, content["allreduce"])
        p.ring_ok = content.get("allreduce") is not None if self.is_root else content.get("ring_ok") is True
        p.ring_bind = content.get("ring_bind") if isinstance(content.get("ring_bind"), str) else None
        if self.host and content.get("chain") is not None and p.reduction is not None:
            self.big.uplinks.join(key, op, content["chain"])  # its big value goes host to host
            p.then = self.big.reduce_chains.own
        elif self.host and content.get("ring") is not None and p.reduction is not None:
            p.then = self.big.reduce_rings.own
        p.big = (
            content.get("shm") is not None
            or content.get("bulk") is not None
            or any(P.nbytes(b) >= self.big_from for b in p.inner[5:])
        )
        if content.get("shm") is not None and not self.is_root:  # big buffers in this host's memory
            try:
                self.sharing.take(p, content["shm"])
            except (OSError, P.ProtocolError) as e:  # shm.ShmError: the segment is gone
                return self.inflight.fail(
                    p, targets, P.UNREACHABLE, f"cannot get the request's buffers: {e}"
                ) + self.inflight.finish_if_done(p)
        elif value_at is not None:  # (an allreduce's value, in a segment here)
            self.sharing.adopt_value(p, *value_at)
        elif not self.is_leaf and not mode and p.big:
            self.sharing.pass_down(p)
        if p.ring_bind is not None and self.host and bound is None:  # (its ring ended here, or never was)
            why = "got no allreduce value: the ring of hosts did not give it to this host"
            return self.inflight.fail(p, content["targets"], P.UNREACHABLE, why) + self.inflight.finish_if_done(p)
        if self.is_root:  # everything is under the root, but for engines whose route went
            strays = [e for e in targets if e in self.routes.departed] if self.routes.departed else []
        else:
            strays = [e for e in targets if not self.serves(e)]
        sends = self._fail_strays(p, strays) if strays else []
        if strays:
            gone = set(strays)
            targets = [e for e in targets if e not in gone]
        if content.get("bulk") is not None and self.host:  # its big buffers come in chunks
            return sends + self.chunks_in.expect(p, content["bulk"], targets)
        if passing:  # host relays this one passes the call on to (``forwarding``)
            sends += self.forwarding.pass_on(p, passing)
        return sends + self._dispatch(p, targets, mode)

    def _assign(self, name: str, p: Pending) -> list[Send]:
        """The root, an allreduce's value combined: unless some engine raised,
        failed or gave a value that does not combine (then the client gets that,
        and no engine a new value), the value goes down to the same engines as
        a push does, bound to ``name``; the client gets how many bound it."""
        r = p.reduction
        value = r.partial()  # (combines what was held: every part is in)
        inner = None
        if value is not None and not (p.raised or p.failed):
            try:  # (a RingValue: the hosts make the request, with their value; this one goes down)
                inner = assign_request(self.codec, p.msg_id, name, None if isinstance(value, RingValue) else value)
            except Exception as e:  # (it serializes the value: the client hears why, no engine waits)
                log.exception("%s: allreduce %s: cannot send the value down", self.name, p.msg_id)
                r.add_error([], f"allreduce: the root could not send the value down: {e}")
        if inner is None:
            p.then = None
            return self.inflight.deliver(p, p.parts, p.failed, None)
        content = P.request_content(p.msg_id, list(r.eids), P.COALESCE, reduce="sum", quiet=True)
        if isinstance(value, RingValue):  # the value is in the hosts of a ring: each binds its own
            content["ring_bind"] = name
        if p.trace is not None:
            content["trace"] = True
        copies = self.inflight.recorded(p, [], 0)  # the first half's replies, for the hub's records
        index = buffer_of(value, inner[5:]) if r.segment is not None and r.segment in p.segments else None
        if index is not None:  # the value's segment goes down as it is: engines map it
            p.segments.remove(r.segment)
            return copies + self.start(p.route, content, inner, arrived=self.wall(), value_at=(r.segment, index))
        return copies + self.start(p.route, content, inner, arrived=self.wall())

    def _plans(self, p: Pending, mode) -> bool:
        """Whether this node plans a reduce's way between its hosts (a chain or
        a ring): not for a ring's bind, whose values are counts."""
        return p.reduction is not None and self.is_leaf and not self.host and not mode and p.ring_bind is None

    def registered(self, engines: dict[int, str], greet: bool, whole: bool = False) -> list[Send]:
        """The hub registered ``engines`` (``whole``: its whole table, in place of
        what was known): parked requests go on to them; ``greet``: asked if they
        share our memory. Parked targets still unknown after a whole table fail."""
        if whole:
            self.engines.clear()
        self.engines.update(engines)
        return (self.greet(engines) if greet else []) + self.retry_parked(final=whole)

    def greet(self, eids) -> list[Send]:
        """Ask engines served here (not through a host relay) whether they share our memory."""
        engines = self.engines
        return self.sharing.greet(
            [engines[e] for e in eids if e in engines and e not in self.routes.via and self.serves(e)]
        )

    def serves(self, eid: int) -> bool:
        """Whether engine ``eid`` is under this node (a host relay: one of its engines)."""
        return eid in self.engines if self.host else self.routes.serves(eid)

    def _dispatch(self, p: Pending, targets, mode=None) -> list[Send]:
        """Send ``p`` on: to engines served here, and one request to each child for its targets."""
        groups = self.routes.split(targets) if not self.host else {None: targets}
        direct = groups.pop(None, None)
        big = self.big
        planned = self._plans(p, mode)
        chain = (big.reduce_rings.plan(p, groups, direct) or big.reduce_chains.plan(p, groups)) if planned else {}
        if p.reduction is not None:  # values combine in a fixed order: see Reduction
            p.reduction.expect({c: min(sub) for c, sub in groups.items()}, direct or ())
        sends = self._to_engines(p, direct) if direct else []
        hosts = [(h.ident, h.url) for h in plans.hosts_of(groups, self.children.bulk)]
        out = self.big.push_out.start(p, hosts, self.boot) if hosts and not mode and p.big else None
        heads = self.forwarding.split(p, groups, mode) if not self.host else {}
        for child, sub in groups.items():
            if heads and child in p.forwarders:
                continue  # passed the call by another host relay
            head = heads.get(child)
            p.state.expect(child, head[1] if head else sub)
            same_host = isinstance(child, int)  # a relay of this tree, not a host relay
            content, frames = p.request_for(sub, mode, p.shared if same_host else None)
            if out is not None and child in out.urls:  # its big buffers come in chunks
                content["bulk"], frames = self.big.push_out.envelope(out, child, frames)
            content.update(chain.get(child, ()))  # its place in a chain or ring
            if head:  # it passes the call on
                content[forwarding.FORWARD] = head[0]
            if same_host and p.reduction is not None and self.sharing.on:  # its value may come by name
                content["vshm"] = ["", self.sharing.store.prefix, 0]
            table, frames = P.join_small(frames)  # (16 host relays: 240 frames sent became 128)
            if table is not None:
                content[P.JOINED] = table
            sends.append(Send(DOWN, [self.children.idents[child]] + self.codec.pack(P.REQUEST, content, frames)))
        if out is not None:
            sends += self.big.push_out.first_sends(out)
            self.inflight.stamp(p, "chunks out", self.big.push_out.last)
        self.inflight.stamp(p, "request out", len(sends))
        return sends + self.inflight.finish_if_done(p)

    def _fail_strays(self, p: Pending, strays) -> list[Send]:
        """Targets not under this node: engines whose route went as they died
        (the request was on its way), or routed here by mistake."""
        departed = self.routes.departed
        dead = [e for e in strays if e in departed]
        other = [e for e in strays if e not in departed]
        sends = self.inflight.fail(p, dead, P.DIED, "died (it was unregistered) before replying") if dead else []
        return sends + (self.inflight.fail(p, other, P.UNREACHABLE, "was routed to the wrong subtree") if other else [])

    def _to_engines(self, p: Pending, targets) -> list[Send]:
        sends, unknown = [], []
        key = p.key.encode()
        if p.big:
            self.sharing.prepare(p, targets, self.engines)
        for eid in targets:
            uuid = self.engines.get(eid)
            if uuid is None:
                unknown.append(eid)
                continue
            p.state.expect(uuid, (eid,))
            own = p.own.pop(eid) if p.own is not None else []
            frames = self.sharing.frames_for(p, uuid, key) if p.shared is not None else None
            if frames is None:
                inner = p.rename(uuid) if p.rename else p.inner
                frames = P.to_engine(uuid, key, inner + own if own else inner)
            elif own:
                frames = frames + own
            sends.append(Send(DOWN, frames))
        if unknown and self.host:  # a host relay knows its engines: no hub to ask
            sends += self.inflight.fail(p, unknown, P.UNKNOWN, f"is not on {self.name}")
        elif unknown:
            p.state.park(unknown)
            self.inflight.park(p)
            sends.append(Send(HUB, []))
        return sends

    def retry_parked(self, final: bool) -> list[Send]:
        sends = []
        for p in self.inflight.take_parked():
            if not p.state.owes(PARKED):
                continue
            eids = p.state.unpark()
            sends += self._to_engines(p, [e for e in eids if e in self.engines])
            left = sorted(e for e in eids if e not in self.engines)
            if left and final:
                sends += self.inflight.fail(p, left, P.UNKNOWN, "is not registered")
            elif left:
                p.state.park(left)
                self.inflight.park(p)
            sends += self.inflight.finish_if_done(p)
        return [s for s in sends if s.socket != HUB]
