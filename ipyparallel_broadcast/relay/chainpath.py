"""A reduce's big values across hosts, at a relay node: the leaf plans the
chain of its host relays and takes the value its head sends; a host relay
sends its own value into the chain (``dataplane.combine``). Part of ``RelayNode``
(``core``); sans I/O."""

from __future__ import annotations

import logging

from ..wire import bundles as B
from ..wire import protocol as P
from ..wire import reduction as R
from .dataplane import combine, reduce_trees
from .dataplane.push import Bulk
from .dataplane.ring import Rings
from .events import DOWN, UP, Send
from .hostfold import HostFold
from .pending import Pending

log = logging.getLogger("ipyparallel_broadcast.relay.core")

CHAIN = ("chain",)  # the leaf's request state: the chain's value is owed


class ChainPath:
    """The leaf's and the host relays' parts of a reduce chain."""

    def _data_planes(self, codec: P.Codec, clock, node_timeout: float, spec: dict | None) -> None:
        """The data planes' state: big requests to hosts in chunks (``bulk``),
        big reduce values host to host (``dataplane.combine``, ``dataplane.reduce_trees``) and round a
        ring, and the host's own engines' values combined in turn (``hostfold``)."""
        spec = dict(spec or {})
        self.reduce_shape = spec.pop("reduce", "auto")  # a reduce's way between hosts (``reduce_trees.choose``)
        self.bulk = Bulk(codec, clock, 2 * node_timeout, **spec)  # ... to hosts, in chunks
        self.chains = combine.Chains(codec, 2 * node_timeout, self.bulk.chunk)  # big reduce values, host to host
        self.uplinks = reduce_trees.Uplinks(self.chains)  # ... a host's own, in its parts
        self.rings = Rings(codec, self.chains, self.bulk.threshold, clock, 2 * node_timeout, self.sharing.drop_value)
        if self.sharing.on:  # chunks are written straight into the segment engines map
            self.bulk.reserve, self.bulk.discard = self.sharing.store.reserve, self.sharing.store.drop
        bulk, rings = self.bulk, self.rings
        self.deadlines.add(  # (no call into bulk while no chunk is in flight)
            "chunks' stall", lambda: bulk.next_deadline() if bulk.incoming or bulk.early_since else None, self._stalled
        )
        self.deadlines.add("chains' stall", self._chain_deadline, self._chains_stalled)
        binds = lambda: rings.next_deadline() if rings.results else None  # noqa: E731
        self.deadlines.add("ring values' binds", binds, self._ring_tick)
        self.fold = HostFold(  # the big values this host's engines hold, combined in turn
            self.context,
            self.sharing,
            self.inflight,
            self.deadlines,
            turn_timeout=2 * node_timeout,
            chunk=self.chains.chunk,
            uplinks=self.uplinks,
            rings=self.rings,
            fail=self._fail,
            settled=self._ring_settled,
        )

    # ------------------------------------------------------------ the leaf
    def _chain_plan(self, p: Pending, groups: dict) -> dict:
        """A reduce to two or more host relays with bulk links: their way to
        this leaf (``p.chain``: a chain or two trees, ``uplinks``) and each
        one's part of it, by host."""
        hosts = [(c, self.children.bulk[c], min(sub)) for c, sub in groups.items() if c in self.children.bulk]
        if len(hosts) < 2 or self.bulk.threshold is None or p.stock:
            return {}
        shape = reduce_trees.choose(len(hosts), self.reduce_shape, self.bulk.chunk)
        order, heads, contents = reduce_trees.plan(hosts, shape)
        first = min(h[2] for h in hosts)
        p.chain = combine.Chain(order, heads, first - 0.5, self.clock())
        self.chains.open.add(p.key)
        self.chains.shape = shape
        p.state.expect(CHAIN, ())
        p.reduction.expect({CHAIN: p.chain.key})
        return {c: dict(chain=content) for c, content in contents.items()}

    def _chain_message(self, child, m) -> list[Send]:
        """A chain message from the head of a part, at the leaf."""
        msg, data = combine.check(self.codec, m.body)
        key, part = reduce_trees.split_key(msg["content"]["key"])
        p = self.pending.get(key)
        if p is None:  # the request was done without it (no host chained a value)
            return []
        chain = p.chain
        if chain is None or chain.outcome is not None or part >= len(chain.heads) or child != chain.heads[part]:
            raise P.ProtocolError(f"chain message for {msg['content']['key']!r} from {child!r}, not its head")
        chain.last = self.clock()
        if not chain.have:
            self.inflight.stamp(p, "chain in")
        if not combine.take(chain, part, msg, data):
            return []
        return self._chain_settled(p)

    def _chained(self, p: Pending, eids, at) -> None:
        """A chained host's bundle came: its engines' value is in the chain."""
        chain = p.chain
        if chain is None:
            raise P.ProtocolError("a chained bundle, but no chain")
        chain.last = self.clock()
        if chain.outcome == "value":
            p.reduction.add(eids, None, at)
        elif chain.outcome == "failed":  # the hosts' values did not combine: so these neither
            p.reduction.add_error(eids, f"reduce: {chain.why}", at)
        elif chain.outcome is not None:  # lost with the chain
            self._fail(p, eids, P.UNREACHABLE, f"lost its value in the reduce chain ({chain.why})")
        else:
            chain.stashed.append((eids, at))

    def _chain_settled(self, p: Pending) -> list[Send]:
        """The chain's outcome is known: its value (or error) combines in its turn."""
        chain, r, sends = p.chain, p.reduction, []
        self.inflight.stamp(p, "chain done", chain.outcome)
        if chain.outcome == "value":
            header = {k: v for k, v in chain.header.items() if k not in ("nbytes", "chunk", "at", "whole")}
            value = R.decode(header, [chain.buffer])
            r.add([], value, chain.key, owned=True)
            for eids, at in chain.stashed:
                r.add(eids, None, at)
        elif chain.outcome == "failed":
            r.add_error([e for eids, _ in chain.stashed for e in eids], f"reduce: {chain.why}", chain.key)
            sends = self._chain_ended(p)  # (hosts that wait for credit from one that stopped let go)
        else:  # no host had a big value: nothing to combine in its turn
            r.skip(chain.key)
            for eids, at in chain.stashed:
                r.add(eids, None, at)
        chain.stashed, chain.buffer = [], None
        self.chains.open.discard(p.key)
        if p.state.owes(CHAIN):
            p.state.answer(CHAIN)
        return sends + self.inflight.finish_if_done(p)

    def _chain_ended(self, p: Pending, gone: bytes | None = None) -> list[Send]:
        """The chain's hosts let go of their links (they wait for as long as the leaf does)."""
        end = self.codec.pack(P.CHAIN_END, dict(keys=[p.key]))
        return [Send(DOWN, [host] + end) for host in p.chain.hosts if host != gone]

    def _chain_unneeded(self, p: Pending) -> list[Send]:
        """Every host's bundle is in and none chained its value: no need to wait."""
        chain = p.chain
        if chain is None or chain.outcome is not None or chain.stashed or p.state.destinations != [CHAIN]:
            return []
        chain.outcome = "none"
        return self._chain_settled(p)

    def _chain_lost(self, host: bytes, why: str) -> list[Send]:
        """A host relay is lost: the chains through it bring nothing; their
        engines' values fail, naming it."""
        sends = []
        for key in list(self.chains.open):
            p = self.pending.get(key)
            if p is not None and p.chain.outcome is None and host in p.chain.hosts:
                sends += self._chain_failed(p, why, gone=host)
        return sends + self._ring_lost(host, why)

    def _chain_failed(self, p: Pending, why: str, gone: bytes | None = None) -> list[Send]:
        """The chain brings nothing: its engines fail, and its other hosts
        let go of their links (they wait for as long as the leaf does)."""
        chain = p.chain
        chain.outcome, chain.why = "lost", f"the chain of hosts {chain.label}: {why}"
        sends = self._chain_ended(p, gone)
        for eids, _ in chain.stashed:
            sends += self._fail(p, eids, P.UNREACHABLE, f"lost its value in the reduce chain ({chain.why})")
        chain.stashed, chain.buffer = [], None
        self.chains.open.discard(p.key)
        p.reduction.skip(chain.key)
        if p.state.owes(CHAIN):
            p.state.answer(CHAIN)
        return sends + self.inflight.finish_if_done(p)

    def _chain_deadline(self) -> float | None:
        """When a chain whose hosts all answered would have stalled."""
        waiting = [self.pending.get(key) for key in self.chains.open] if self.chains.open else ()
        times = [p.chain.last + self.chains.stall for p in waiting if p is not None and self._all_but_chain(p)]
        return min(times, default=None)

    def _plane_stats(self) -> dict:
        """The data plane's counts, for a survey: chunks of pushes, chains and rings."""
        return dict(
            self.bulk.stats(),
            chain_sent=self.chains.sent,
            chain_received=self.chains.received,
            chain_shape=self.chains.shape,  # the last reduce's way between hosts: a chain or two trees
            ring_gathered=self.rings.gathered,  # final chunks of allreduce values written here
            ring_forwarded=self.rings.forwarded,
            held_values=self.fold.waiting(),  # engines' turns to come
        )

    def _chains_stalled(self, now: float) -> list[Send]:
        sends = []
        for key in list(self.chains.open):
            p = self.pending.get(key)
            if p is None:
                self.chains.open.discard(key)
            elif self._all_but_chain(p) and now - p.chain.last > self.chains.stall:
                sends += self._chain_failed(p, f"nothing came for {self.chains.stall:g} s")
        return sends

    @staticmethod
    def _all_but_chain(p: Pending) -> bool:
        """Every host has answered; only the chain's value is owed."""
        return p.chain.outcome is None and p.state.destinations == [CHAIN]

    # --------------------------------------------------------- a host relay
    def _chain_own(self, p: Pending) -> list[Send]:
        """All this host's engines are in: its bundle goes to the leaf, its
        big value (if any) into the chain instead."""
        p.then = None
        state, frames = p.reduction.state()
        header = data = None
        if state["value"] is not None and frames and P.nbytes(frames[0]) >= self.bulk.threshold:
            header, data = state["value"], frames[0]
            state, frames = dict(state, value=None, chained=True), []
        body = B.pack_reduced(self.codec, p.key, p.msg_id, state, frames, p.raised, p.failed)
        self.inflight.stamp(p, "reply out", p.n)
        sends = self.inflight.recorded(p, [Send(UP, P.with_route(p.route, body))], p.n)
        return sends + self.uplinks.own_value(p.key, header, data)
