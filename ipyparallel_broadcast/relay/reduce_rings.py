"""An allreduce's big value round a ring of host relays, a part of a relay
node that owns its state: the leaf plans the ring (``plan``) and ends it
when a host of it cannot take part; a host relay puts its value in
(``own``), sends its bundle once the whole value is here (``settled``), and
has its engines bind it at the root's word (``bound``). The ring itself is
the data plane's (``dataplane.ring``). Sans I/O."""

from __future__ import annotations

import logging

from ..wire import bundles as B
from ..wire import protocol as P
from ..wire import reduction as R
from .children import Children
from .context import NodeContext
from .dataplane import plans
from .dataplane.ends import end_links
from .dataplane.ring import Rings
from .deadlines import Deadlines
from .events import UP, Send
from .inflight import InFlight, Pending
from .sharing import Sharing

log = logging.getLogger("ipyparallel_broadcast.relay.node")


class ReduceRings:
    """Given: the requests in flight, the children (their chunk sockets and
    names), the host's shared memory, the deadline registry, and the data
    plane's ``rings``."""

    def __init__(
        self,
        ctx: NodeContext,
        inflight: InFlight,
        children: Children,
        sharing: Sharing,
        deadlines: Deadlines,
        rings: Rings,
    ):
        self.ctx, self.inflight, self.children, self.sharing, self.rings = ctx, inflight, children, sharing, rings
        self.of: dict[str, list[bytes]] = {}  # the leaf: request key -> the hosts of its ring, until it ends
        inflight.when_done(lambda p: self.of.pop(p.key, None))
        deadlines.add("ring values' binds", lambda: rings.next_deadline() if rings.results else None, self._expired)

    # ------------------------------------------------------------ the leaf
    def plan(self, p: Pending, groups: dict, direct) -> dict:
        """An allreduce whose targets are all on two or more host relays with
        chunk links (and none elsewhere): their ring, and each host's part in it."""
        hosts = plans.hosts_of(groups, self.children.bulk)
        if not p.ring_ok or direct or len(hosts) < 2 or len(hosts) != len(groups) or p.stock:
            return {}
        self.of[p.key], contents = plans.ring(hosts)
        return {c: dict(ring=content) for c, content in contents.items()}

    def has(self, p: Pending) -> bool:
        return p.key in self.of

    def answered(self, p: Pending, child, msg: dict) -> list[Send]:
        """A host's bundle came: one whose value is not the ring's ends the ring
        at the other hosts (they would wait for its parts)."""
        if child not in self.of.get(p.key, ()):
            return []
        state = B.reduced_parts(msg)[0]  # (its content is parsed: ``fold_bundle``)
        if isinstance(state.get("value"), dict) and state["value"].get("t") == "ring" and not state.get("error"):
            return []
        name = self.children.names.get(child, repr(child))
        cause = state.get("error") or ("its value was too small" if state.get("value") else "its engines gave none")
        return self._end(p, f"{name} gave it no value ({cause})", but=child)

    def host_lost(self, host: bytes, why: str) -> list[Send]:
        """A host relay is lost: the rings through it end at the other hosts."""
        sends = []
        for key in [k for k, hosts in self.of.items() if host in hosts]:
            p = self.inflight.requests.get(key)
            if p is not None:
                sends += self._end(p, f"it lost a host: {why}", but=host)
        return sends

    def _end(self, p: Pending, why: str, but=None) -> list[Send]:
        return end_links(self.ctx.codec, p.key, self.of.pop(p.key), f"the ring of hosts ended: {why}", but)

    # --------------------------------------------------------- a host relay
    def own(self, p: Pending) -> list[Send]:
        """All this host's engines are in: its value goes round; its bundle
        goes once the whole value is here (or at once, if it takes no part)."""
        p.then = None
        r = p.reduction
        r.partial()  # (combines what was held)
        taken = None
        if r.error is None and r.sig is not None and r.sig[0] == "nd":
            header, frames = R.encode(r.value)
            data, ref = frames[0] if frames else b"", r.segment if r.segment in p.segments else None
            if not r.owned and self.rings.takes(p.key, P.nbytes(data)):  # (a frame's: the ring writes over its own)
                data = bytearray(data)
            taken = self.rings.own_value(p.key, header, data, ref, waiting=p)
            if taken is not None and ref is not None:
                p.segments.remove(ref)  # the ring keeps it: engines map it when they bind
        why = self.rings.ended.get(p.key)
        if taken is None and why and r.sig is not None and r.error is None:  # the leaf ended it already
            r.add_error([], f"allreduce: {why}")  # (its value goes no further)
        if taken is None:  # it takes no part: its bundle goes as it is, and the leaf ends the ring
            self.rings.end([p.key], "this host took no part")
            return self.settled() + self.inflight.deliver(p, p.parts, p.failed, None)
        return taken + self.settled()

    def settled(self) -> list[Send]:
        """Bundles of requests whose ring's outcome is now known here."""
        sends = []
        while self.rings.settled:
            ring = self.rings.settled.pop(0)
            p = ring.waiting
            if p is None:
                continue
            state, _ = p.reduction.state()
            if ring.outcome == "value":  # the bundle stands for the value, which stays here
                state = dict(state, value=dict(ring.own[0], t="ring"))
            else:
                state = dict(state, value=None, error=f"allreduce: {ring.why}")
            body = B.pack_reduced(self.ctx.codec, p.key, p.msg_id, state, [], p.raised, p.failed)
            self.inflight.stamp(p, "ring done", ring.outcome)
            sends += self.inflight.recorded(p, [Send(UP, P.with_route(p.route, body))], p.n)
        return sends

    def bound(self, content: dict):
        """A host's part of an allreduce's bind (``ring_bind``: the name): the
        request the engines get, with the whole value here, and where that
        value lives ((segment, buffer index), or None); None if it is not here."""
        ring = self.rings.bind(content["msg_id"])
        if ring is None:
            return None
        header, view = ring.own
        value = R.decode(header, [view])
        inner = R.assign_request(self.ctx.codec, content["msg_id"], content["ring_bind"], value)
        index = R.buffer_of(value, inner[5:]) if ring.ref is not None else None
        if ring.ref is not None and index is None:
            self.sharing.drop_value(ring.ref)  # (the engines get its bytes)
        return inner, (ring.ref, index) if index is not None else None

    def _expired(self, now: float) -> list[Send]:
        for key in self.rings.expired(now):
            log.warning("%s: no bind came for the allreduce value of %s; let go", self.ctx.name, key)
        return []

    def stats(self) -> dict:
        return dict(ring_gathered=self.rings.gathered, ring_forwarded=self.rings.forwarded)
