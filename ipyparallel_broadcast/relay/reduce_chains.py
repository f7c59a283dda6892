"""A reduce's big values up a chain or two trees of host relays, a part of
a relay node that owns its state: the leaf plans the way (``plan``) and
takes the value the heads send (``on_message``); a host relay sends its own
value in (``own``). The way itself is the data plane's
(``dataplane.chains``, ``dataplane.reduce_trees``). Sans I/O."""

from __future__ import annotations

from collections.abc import Callable

from ..wire import bundles as B
from ..wire import protocol as P
from ..wire import reduction as R
from .children import Children
from .context import NodeContext
from .dataplane import chains as upchain
from .dataplane import plans, reduce_trees
from .dataplane.chains import Chain, Chains
from .dataplane.ends import end_links
from .dataplane.reduce_trees import Uplinks
from .deadlines import Deadlines
from .events import UP, Send
from .inflight import InFlight, Pending

CHAIN = ("chain",)  # the leaf's request state: the chain's value is owed


class ReduceChains:
    """Given: the requests in flight, the children (their chunk sockets), the
    deadline registry; the data plane's threshold (the least bytes that go in chunks),
    ``chains`` and ``uplinks``; ``shape``, the setting that picks the way;
    ``fail(p, eids, code, reason)`` of the node."""

    def __init__(
        self,
        ctx: NodeContext,
        inflight: InFlight,
        children: Children,
        deadlines: Deadlines,
        *,
        threshold: int | None,
        chains: Chains,
        uplinks: Uplinks,
        shape: str,
        fail: Callable[[Pending, list, str, str], list[Send]],
    ):
        self.ctx, self.inflight, self.children = ctx, inflight, children
        self.threshold, self.chains, self.uplinks, self.setting, self.fail = threshold, chains, uplinks, shape, fail
        self.of: dict[str, Chain] = {}  # the leaf: request key -> its chain, while the request is here
        self.open: set[str] = set()  # ... those whose chain's outcome is not known yet
        self.shape: str | None = None  # the last reduce's way between hosts, for stats
        inflight.when_done(lambda p: self.of.pop(p.key, None))
        deadlines.add("chains' stall", self._next_stall, self._stalled)

    # ------------------------------------------------------------ the leaf
    def plan(self, p: Pending, groups: dict) -> dict:
        """A reduce to two or more host relays with chunk links: their way to
        this leaf (a chain or two trees, ``reduce_trees``) and each one's
        part of it, by host."""
        hosts = plans.hosts_of(groups, self.children.bulk)
        if len(hosts) < 2 or self.threshold is None or p.stock:
            return {}
        shape = reduce_trees.choose(len(hosts), self.setting, self.chains.chunk)
        order, heads, contents = plans.reduce_way(hosts, shape)
        first = hosts[0].first
        chain = self.of[p.key] = Chain(order, heads, first - 0.5, self.ctx.clock())
        self.open.add(p.key)
        self.shape = shape
        p.state.expect(CHAIN, ())
        p.reduction.expect({CHAIN: chain.key})
        return {c: dict(chain=content) for c, content in contents.items()}

    def has(self, p: Pending) -> bool:
        return p.key in self.of

    def on_message(self, child, m) -> list[Send]:
        """A chain message from the head of a part, at the leaf."""
        msg, data = upchain.check(self.ctx.codec, m.body)
        key, part = reduce_trees.split_key(msg["content"]["key"])
        p, chain = self.inflight.requests.get(key), self.of.get(key)
        if p is None:  # the request was done without it (no host chained a value)
            return []
        if chain is None or chain.outcome is not None or part >= len(chain.heads) or child != chain.heads[part]:
            raise P.ProtocolError(f"chain message for {msg['content']['key']!r} from {child!r}, not its head")
        chain.last = self.ctx.clock()
        if not chain.have:
            self.inflight.stamp(p, "chain in")
        if not upchain.take(chain, part, msg, data):
            return []
        return self._settled(p, chain)

    def chained(self, p: Pending, eids, at) -> None:
        """A chained host's bundle came: its engines' value is in the chain
        (failed here if the chain was lost: they go with the request's outcomes)."""
        chain = self.of.get(p.key)
        if chain is None:
            raise P.ProtocolError("a chained bundle, but no chain")
        chain.last = self.ctx.clock()
        if chain.outcome == "value":
            p.reduction.add(eids, None, at)
        elif chain.outcome == "failed":  # the hosts' values did not combine: so these neither
            p.reduction.add_error(eids, f"reduce: {chain.why}", at)
        elif chain.outcome is not None:  # lost with the chain
            self.fail(p, eids, P.UNREACHABLE, f"lost its value in the reduce chain ({chain.why})")
        else:
            chain.stashed.append((eids, at))

    def _settled(self, p: Pending, chain: Chain) -> list[Send]:
        """The chain's outcome is known: its value (or error) combines in its turn."""
        r, sends = p.reduction, []
        self.inflight.stamp(p, "chain done", chain.outcome)
        if chain.outcome == "value":
            header = {k: v for k, v in chain.header.items() if k not in ("nbytes", "chunk", "at", "whole")}
            value = R.decode(header, [chain.buffer])
            r.add([], value, chain.key, owned=True)
            for eids, at in chain.stashed:
                r.add(eids, None, at)
        elif chain.outcome == "failed":
            r.add_error([e for eids, _ in chain.stashed for e in eids], f"reduce: {chain.why}", chain.key)
            sends = self._ended(p, chain)  # (hosts that wait for credit from one that stopped let go)
        else:  # no host had a big value: nothing to combine in its turn
            r.skip(chain.key)
            for eids, at in chain.stashed:
                r.add(eids, None, at)
        chain.stashed, chain.buffer = [], None
        self.open.discard(p.key)
        if p.state.owes(CHAIN):
            p.state.answer(CHAIN)
        return sends + self.inflight.finish_if_done(p)

    def _ended(self, p: Pending, chain: Chain, gone: bytes | None = None) -> list[Send]:
        """The chain's hosts let go of their links (they wait for as long as the leaf does)."""
        return end_links(self.ctx.codec, p.key, chain.hosts, but=gone)

    def unneeded(self, p: Pending) -> list[Send]:
        """Every host's bundle is in and none chained its value: no need to wait."""
        chain = self.of.get(p.key)
        if chain is None or chain.outcome is not None or chain.stashed or p.state.destinations != [CHAIN]:
            return []
        chain.outcome = "none"
        return self._settled(p, chain)

    def host_lost(self, host: bytes, why: str) -> list[Send]:
        """A host relay is lost: the chains through it bring nothing; their
        engines' values fail, naming it."""
        sends = []
        for key in list(self.open):
            p, chain = self.inflight.requests.get(key), self.of.get(key)
            if p is not None and chain is not None and chain.outcome is None and host in chain.hosts:
                sends += self._failed(p, chain, why, gone=host)
        return sends

    def _failed(self, p: Pending, chain: Chain, why: str, gone: bytes | None = None) -> list[Send]:
        """The chain brings nothing: its engines fail, and its other hosts
        let go of their links (they wait for as long as the leaf does)."""
        chain.outcome, chain.why = "lost", f"the chain of hosts {chain.label}: {why}"
        sends = self._ended(p, chain, gone)
        for eids, _ in chain.stashed:
            sends += self.fail(p, eids, P.UNREACHABLE, f"lost its value in the reduce chain ({chain.why})")
        chain.stashed, chain.buffer = [], None
        self.open.discard(p.key)
        p.reduction.skip(chain.key)
        if p.state.owes(CHAIN):
            p.state.answer(CHAIN)
        return sends + self.inflight.finish_if_done(p)

    def _waiting(self):
        """(request, chain) of chains whose hosts all answered: only the chain's value is owed."""
        for key in list(self.open):
            p, chain = self.inflight.requests.get(key), self.of.get(key)
            if p is None or chain is None:
                self.open.discard(key)
            elif chain.outcome is None and p.state.destinations == [CHAIN]:
                yield p, chain

    def _next_stall(self) -> float | None:
        """When a chain whose hosts all answered would have stalled."""
        return min((chain.last + self.chains.stall for _, chain in self._waiting()), default=None)

    def _stalled(self, now: float) -> list[Send]:
        sends = []
        for p, chain in list(self._waiting()):
            if now - chain.last > self.chains.stall:
                sends += self._failed(p, chain, f"nothing came for {self.chains.stall:g} s")
        return sends

    def stats(self) -> dict:
        return dict(chain_sent=self.chains.sent, chain_received=self.chains.received, chain_shape=self.shape)

    # --------------------------------------------------------- a host relay
    def own(self, p: Pending) -> list[Send]:
        """All this host's engines are in: its bundle goes to the leaf, its
        big value (if any) into the chain instead."""
        p.then = None
        state, frames = p.reduction.state()
        header = data = None
        if state["value"] is not None and frames and P.nbytes(frames[0]) >= self.threshold:
            header, data = state["value"], frames[0]
            state, frames = dict(state, value=None, chained=True), []
        body = B.pack_reduced(self.ctx.codec, p.key, p.msg_id, state, frames, p.raised, p.failed)
        self.inflight.stamp(p, "reply out", p.n)
        sends = self.inflight.recorded(p, [Send(UP, P.with_route(p.route, body))], p.n)
        return sends + self.uplinks.own_value(p.key, header, data)
