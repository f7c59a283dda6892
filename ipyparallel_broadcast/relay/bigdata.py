"""A relay node's big-data parts, built together: the data plane's
transports (``dataplane``: a push's chunks, a reduce's combining links and
their way, an allreduce's ring) and the parts of the node that use them
(``reduce_chains``, ``reduce_rings``, ``hostfold``). Sans I/O."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .children import Children
from .context import NodeContext
from .dataplane.chains import Chains
from .dataplane.push import CHUNK, PushOut
from .dataplane.push_in import PushIn
from .dataplane.reduce_trees import Uplinks
from .dataplane.ring import Rings
from .deadlines import Deadlines
from .events import Send
from .hostfold import HostFold
from .inflight import InFlight
from .reduce_chains import ReduceChains
from .reduce_rings import ReduceRings
from .sharing import Sharing


@dataclass
class BigData:
    push_out: PushOut  # a push's big buffers to hosts, in chunks, at a leaf
    push_in: PushIn  # ... assembled and passed on, at a host relay
    chains: Chains  # a reduce's combining links, at a host relay
    uplinks: Uplinks  # ... a host's own value, cut into its parts
    rings: Rings  # an allreduce's ring, at a host relay
    reduce_chains: ReduceChains
    reduce_rings: ReduceRings
    fold: HostFold  # the values this host's engines hold, combined in turn

    @classmethod
    def build(
        cls,
        ctx: NodeContext,
        inflight: InFlight,
        children: Children,
        sharing: Sharing,
        deadlines: Deadlines,
        *,
        stall: float,
        spec: dict | None,
        fail: Callable,
        stalled: Callable[[float], list[Send]],
    ) -> BigData:
        """``spec``: the data plane's settings (chunk, threshold, fanout, and
        ``reduce``: the way a reduce's values go between hosts); ``stall``:
        how long chunks may not come; ``stalled(now)``: the node's handling
        of pushes whose chunks stopped coming."""
        spec = dict(spec or {})
        shape = spec.pop("reduce", "auto")
        push_out = PushOut(ctx.codec, ctx.clock, shape=spec.pop("push", "auto"), **spec)
        store = dict(reserve=sharing.store.reserve, discard=sharing.store.drop) if sharing.on else {}
        push_in = PushIn(ctx.codec, ctx.clock, stall, **store)  # (chunks written into the segment engines map)
        chains = Chains(ctx.codec, stall, push_out.chunk or CHUNK)  # (a reduce's hosts must agree on one)
        uplinks = Uplinks(chains)
        rings = Rings(ctx.codec, chains, push_out.threshold, ctx.clock, stall, sharing.drop_value)
        deadlines.add("chunks' stall", push_in.next_deadline, stalled)
        deadlines.add("chunks to make", push_out.making, lambda now: push_out.make_more())
        parts = (ctx, inflight, children)
        reduce_chains = ReduceChains(
            *parts, deadlines, threshold=push_out.threshold, chains=chains, uplinks=uplinks, shape=shape, fail=fail
        )
        reduce_rings = ReduceRings(*parts, sharing, deadlines, rings)
        fold = HostFold(
            ctx,
            sharing,
            inflight,
            deadlines,
            turn_timeout=stall,
            chunk=chains.chunk,
            uplinks=uplinks,
            rings=rings,
            fail=fail,
            settled=reduce_rings.settled,
        )
        return cls(push_out, push_in, chains, uplinks, rings, reduce_chains, reduce_rings, fold)

    def host_lost(self, host: bytes, why: str) -> list[Send]:
        """A host relay is lost: the hosts it fed chunks get them from here;
        the chains and rings through it end."""
        sends = self.push_out.orphaned(host) + self.reduce_chains.host_lost(host, why)
        return sends + self.reduce_rings.host_lost(host, why)

    def leaf_ended(self, keys: list, why: str) -> list[Send]:
        """A host relay: the leaf gave up on these chains or rings."""
        self.rings.end(keys, why or "the leaf ended the ring")
        return self.uplinks.end(keys) + self.reduce_rings.settled()

    def leaf_restarted(self) -> list[Send]:
        """A host relay: its leaf restarted, and leads none of the chains and rings it led."""
        return self.leaf_ended(list(self.chains.links) + self.rings.everything(), "the leaf restarted")

    def stats(self) -> dict:
        """Counts of chunks of pushes, chains and rings, and engines' turns to come."""
        return dict(
            self.push_out.stats(),
            **self.push_in.stats(),
            **self.reduce_chains.stats(),
            **self.reduce_rings.stats(),
            held_values=self.fold.waiting(),
        )
