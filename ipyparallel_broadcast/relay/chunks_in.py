"""A host relay's chunk socket, a part that owns what comes in on it: each
message goes by its type (one table) to the push's assembly, a reduce's
combining link (chunks and credit) or an allreduce's ring; a push's request
goes on once its chunks are all here, and fails if they stop coming.
Sans I/O."""

from __future__ import annotations

from collections.abc import Callable

from ..wire import protocol as P
from .bigdata import BigData
from .context import NodeContext
from .dataplane import chains as upchain
from .dataplane import ring
from .dataplane.push_in import Incoming
from .events import Send
from .inflight import InFlight, Pending
from .sharing import Sharing
from .state import AWAITING_DATA


class ChunksIn:
    """Given: what the node is, the requests in flight, the host's shared
    memory, the big-data parts, and ``go_on(p, targets)``: the request's way
    on once its data came."""

    def __init__(
        self,
        ctx: NodeContext,
        inflight: InFlight,
        sharing: Sharing,
        big: BigData,
        go_on: Callable[[Pending, list], list[Send]],
    ):
        self.ctx, self.inflight, self.sharing, self.big, self.go_on = ctx, inflight, sharing, big, go_on
        # a message's type, as its header frame spells it -> its handler; anything else: a push's chunk
        self.handlers = {
            upchain.MARK: self._combine_chunk,
            upchain.CREDIT_MARK: self._credit,
            ring.MARK: self._ring_chunk,
        }

    def on_chunk(self, frames) -> list[Send]:
        """A chunk of a big request, from the host or leaf that feeds this
        one; of a reduce's value, or credit for one, from a host of its way;
        or of an allreduce's value, from the host before this one in a ring."""
        try:
            _, body = P.split_idents(frames)
            header = P.as_bytes(body[1]) if len(body) > 1 else b""
            handler = next((h for mark, h in self.handlers.items() if mark in header), None)
            if handler is not None:
                return handler(body)
            sends, inc = self.big.push_in.on_chunk(frames)
        except P.ProtocolError as e:
            return self.ctx.drop(f"chunk: {e}")
        return sends + (self._complete(inc) if inc is not None else [])

    def _combine_chunk(self, body) -> list[Send]:
        msg, data = upchain.check(self.ctx.codec, body)
        return self.big.chains.on_message(msg, data) + self.big.reduce_rings.settled()

    def _credit(self, body) -> list[Send]:
        return self.big.chains.on_credit(upchain.check_credit(self.ctx.codec, body))

    def _ring_chunk(self, body) -> list[Send]:
        msg, data = ring.check(self.ctx.codec, body)
        return self.big.rings.on_gather(msg, data, body) + self.big.reduce_rings.settled()

    def expect(self, p: Pending, content, targets) -> list[Send]:
        """``p`` came with a chunk layout: it waits for its data."""
        p.state.await_data(targets)  # not done before its data came
        inc, sends = self.big.push_in.expect(p, content, len(p.inner) - 5)
        return sends + (self._complete(inc) if inc.complete else [])

    def _complete(self, inc: Incoming) -> list[Send]:
        """Every chunk is here and checked: the request goes to the engines."""
        p, buffers, ref = self.inflight.requests.get(inc.key), inc.buffers, inc.ref
        adopted = p is not None and p.state.owes(AWAITING_DATA)
        self.big.push_in.finished(inc, adopted)
        if not adopted:
            return []
        inner = list(p.inner)
        for (i, _), buf in zip(inc.layout.bufs, buffers):
            inner[5 + i] = buf
        p.inner = inner
        if ref is not None:
            self.sharing.adopt(p, ref, [(i, buf) for (i, _), buf in zip(inc.layout.bufs, buffers)])
        self.inflight.stamp(p, "first chunk in", ago=self.ctx.clock() - inc.first)
        self.inflight.stamp(p, "chunks in", inc.layout.n)
        return self.go_on(p, p.state.data_came())

    def stalled(self, now: float) -> list[Send]:
        """Pushes whose chunks stopped coming: their engines here fail."""
        sends = []
        for inc in self.big.push_in.stalled(now):
            p = self.inflight.requests.get(inc.key) if inc.key is not None else None
            if p is not None and p.state.owes(AWAITING_DATA):
                why = (
                    f"did not get the request's data: {len(inc.have)} of {inc.layout.n} chunks came, "
                    f"then none for {self.big.push_in.stall:g} s"
                )
                sends += self.inflight.fail(p, p.state.give_up(AWAITING_DATA), P.UNREACHABLE, why)
                sends += self.inflight.finish_if_done(p)
        return sends
