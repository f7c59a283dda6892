"""Replies' way up a relay node, a part that owns its flow: an engine's
reply, a child's bundle (or pong, survey reply, routes, chain message), and
the failures that stand in for replies of an engine that is lost. Sans I/O;
it reaches the node only through what it is given."""

from __future__ import annotations

import logging

from ..wire import protocol as P
from ..wire.reduction import fold_bundle, fold_reply
from ..wire.topology import HOST_PREFIX
from . import events as E
from .dataplane.chains import RCHUNK
from .events import DOWN, Send
from .flow import FlowParts
from .forwarding import RECEIPT
from .heartbeat import Heartbeats
from .routes import Announcements, Key
from .sharing import HELLO_KEY
from .surveys import Surveys

FOLD_KEY = P.FOLD_KEY.decode()

log = logging.getLogger("ipyparallel_broadcast.relay.node")


class UpFlow:
    """Replies' way up: filed in their request, packed when complete. Given:
    the node's ``FlowParts``, and its route announcements, surveys and
    heartbeats."""

    def __init__(
        self,
        parts: FlowParts,
        *,
        announce: Announcements,
        surveys: Surveys,
        heartbeats: Heartbeats,
        records: bool = False,
    ):
        ctx = parts.ctx
        self.codec, self.clock, self.name, self.host = ctx.codec, ctx.clock, ctx.name, ctx.host
        self.is_leaf, self.forwarding = parts.is_leaf, parts.forwarding
        self.records = records  # engines' replies to reductions copied for the hub (``RelayNode``'s ``records``)
        self.inflight, self.pending, self.engines = parts.inflight, parts.inflight.requests, parts.engines
        self.routes, self.children, self.sharing, self.big = parts.routes, parts.children, parts.sharing, parts.big
        self.announce, self.surveys, self.heartbeats = announce, surveys, heartbeats

    def engine_reply(self, reply: E.EngineReply) -> list[Send]:
        sharing = self.sharing  # a greeting's answer, or a reply from an engine greeted in vain
        greeted = sharing.on and (reply.key == HELLO_KEY or reply.uuid in sharing.unreached)
        greetings = sharing.on_reply(reply.uuid, reply.key, reply.body) if greeted else []
        if reply.key == HELLO_KEY:
            return greetings
        if reply.key == FOLD_KEY:
            return greetings + self.big.fold.on_answer(reply.uuid, reply.body)
        p = self.pending.get(reply.key)
        if p is None or not p.state.owes(reply.uuid):
            raise P.ProtocolError(f"unexpected reply from engine {reply.uuid} to {reply.key}")
        eids, body = sorted(p.state.answer(reply.uuid)), reply.body  # (one engine)
        if p.trace is not None:  # the detail is formatted only for a traced request
            self.inflight.stamp(p, "reply in", f"engine {eids[0]}")
        if self.records and p.reduction is not None and not p.quiet:  # for the hub: one copy of them all
            p.recorded.append(body)
        if p.reduction is not None:
            hold = lambda eid, held: self.big.fold.held(p, eid, reply.uuid, held)  # noqa: E731
            if not fold_reply(p.reduction, eids, body, self.codec, hold):
                p.raised.append(body)
            if self.big.fold.holds(p.key):
                return greetings + self.big.fold.go(p)
        elif p.stream:
            return greetings + self.inflight.emit(p, [body], [], eids) + self.inflight.finish_if_done(p)
        else:
            p.parts.append(body)
        return greetings + self.inflight.finish_if_done(p)

    def child_message(self, m: E.ChildMessage) -> list[Send]:
        """From a child node or host relay: a bundle, pong, survey reply or route."""
        children = self.children  # (its tables read in place: this runs for every bundle)
        child = children.keys.get(m.ident)
        if child is None:
            if not (self.is_leaf and m.ident.startswith(HOST_PREFIX) and m.kind in (P.PONG, P.HOST)):
                raise P.ProtocolError(f"message from unknown peer {m.ident!r}")
            child = children.add_host(m.ident)
        children.spoke(child)
        if m.kind == P.PONG:
            return self.heartbeats.pong(child, m.content(self.codec))
        if m.kind == P.STATS_REPLY:
            return self.surveys.reply(child, m.content(self.codec))
        if m.kind == P.HOST and isinstance(child, bytes):
            eids, sends = self.announce.from_host(child, m.content(self.codec))
            for eid, uuid in eids.items():  # before the hub's notification, maybe
                self.engines.setdefault(eid, uuid)
            return sends
        if m.kind == P.ROUTE and isinstance(child, int):
            return self.announce.from_child(child, m.content(self.codec))
        if m.kind == RCHUNK and isinstance(child, bytes):
            return self.big.reduce_chains.on_message(child, m)
        return self._child_bundle(child, m)

    def passed_back(self, m: E.ChildMessage) -> list[Send]:
        """A host relay: outcomes of a call it passed on to another, or its receipt (``forwarding``)."""
        if m.kind == RECEIPT:
            return self.forwarding.receipt(m.ident, m.content(self.codec))
        return self._child_bundle(m.ident, m)

    def _child_bundle(self, child: Key, m: E.ChildMessage) -> list[Send]:
        meta = m.msg["metadata"]
        if m.kind != P.BUNDLE or not isinstance(meta, dict):
            raise P.ProtocolError("expected a bundle from a child")
        req = meta.get("req")
        p = self.pending.get(req) if isinstance(req, str) else None
        if p is None or not p.state.owes(child):
            raise P.ProtocolError(f"unexpected bundle for {req!r}")
        if p.trace is not None:
            self.inflight.stamp(p, "reply in", f"node {self.children.names.get(child, child)}")
        if p.reduction is not None:
            chains, rings = self.big.reduce_chains, self.big.reduce_rings
            chained = (lambda eids, at: chains.chained(p, eids, at)) if chains.has(p) else None
            raised, failed = fold_bundle(p.reduction, m.msg, self.codec, child, chained, self.sharing.value_taker(p))
            p.state.answer(child)
            p.raised.extend(raised)
            p.failed.extend(failed)
            sends = rings.answered(p, child, m.msg) if rings.has(p) else []
            return sends + (chains.unneeded(p) if chains.has(p) else []) + self.inflight.finish_if_done(p)
        if p.stream:
            eids = meta.get("eids")
            if (
                not isinstance(eids, list)
                or not all(type(e) is int for e in eids)
                or not p.state.answer_some(child, eids)
            ):
                raise P.ProtocolError("streamed bundle names engines not owed")
            return self.inflight.forward(p, m.msg, m.body) + self.inflight.finish_if_done(p)
        p.state.answer(child)
        (p.bundles if self.is_leaf else p.parts).append(m.msg if p.compat else m.body)
        return self.inflight.finish_if_done(p)

    def engine_lost(self, uuid: str, why: str) -> list[Send]:
        """What waits on an engine fails. One behind a host relay is failed by that
        relay, told here; here too if the relay fell silent (a host cut off)."""
        eids = self.engines.eids_of(uuid)
        eid = eids[0] if eids else None
        host = self.routes.via.get(eid)
        self.sharing.forget(uuid)
        if why == P.DIED:
            for e in eids:
                del self.engines[e]  # (in place: the node's parts share the table)
            self.routes.unregister(uuid)
            if host is not None:
                self.routes.host_lost_engine(eid)
        code = P.DIED if why == P.DIED else P.UNREACHABLE
        if host is None or host not in self.children:
            sends = self.inflight.fail_waiting_on(uuid, code, lambda eid: f"Engine {eid} {why} before replying")
            if self.host and why == P.DIED:  # alive, maybe, but the hub will not take it back
                sends.append(Send(DOWN, [uuid.encode()] + self.codec.pack(P.DROPPED, {})))
            return sends
        sends = [Send(DOWN, [host] + self.codec.pack(P.LOST, dict(uuid=uuid, why=why)))]
        if why == P.DIED:
            sends += self.announce.up([], [eid])
        silent = self.clock() - self.children.heard[host]
        if silent > 2 * self.children.interval:
            where = self.children.names[host]
            sends += self.inflight.fail_via(
                host,
                eid,
                [
                    eid,
                    uuid,
                    f"Engine {eid} on {where} {why} before replying (its host relay silent for {silent:.1f} s)",
                    code,
                ],
            )
        return sends
