"""The in-host fold, a part of a relay node that owns its state: the big
reduce values its host's engines hold are combined where they are, the
engines taking turns in one segment (``turns`` keeps the order). Turns are
handed out, answers taken, holders that die or stall dropped, and the host's
value joins the request's reduction. Sans I/O."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import zip_longest

from ..wire import protocol as P
from ..wire import reduction as R
from ..wire.reduction import Held
from .context import NodeContext
from .deadlines import Deadlines
from .events import DOWN, Send
from .inflight import InFlight, Pending
from .sharing import Sharing
from .state import FOLD
from .turns import Turns

STRIPE_MAX = 16 << 20  # bytes: the largest stripe of a host's value in a reduce chain


def stripes(lo: int, hi: int, chunk: int, size: int = 0) -> list[tuple[int, int]]:
    """Bytes ``lo`` to ``hi`` in stripes: the first ``size`` bytes (default
    two chunks), then each stripe twice the one before, up to ``STRIPE_MAX``
    (in whole chunks)."""
    out, size = [], size or 2 * chunk
    while lo < hi:
        out.append((lo, min(hi, lo + size)))
        lo, size = out[-1][1], min(2 * size, max(chunk, STRIPE_MAX // chunk * chunk))
    return out


@dataclass
class Fold:
    p: Pending  # the request whose engines here hold values
    turns: Turns


class HostFold:
    """Holders' turns, per request. Given: the host's shared memory, the
    requests in flight, the deadline registry; ``uplinks`` and ``rings``
    (where a host's value goes on, stripe by stripe), ``chunk`` (their chunk
    size), ``fail(p, eids, code, reason)`` and ``settled()`` (bundles of rings
    now settled) of the node."""

    def __init__(
        self,
        ctx: NodeContext,
        sharing: Sharing,
        inflight: InFlight,
        deadlines: Deadlines,
        *,
        turn_timeout: float,
        chunk: int,
        uplinks,
        rings,
        fail: Callable[[Pending, list, str, str], list[Send]],
        settled: Callable[[], list[Send]],
    ):
        self.ctx, self.sharing, self.inflight = ctx, sharing, inflight
        self.turn_timeout, self.chunk, self.uplinks, self.rings = turn_timeout, chunk, uplinks, rings
        self.fail, self.settled = fail, settled
        self.folds: dict[str, Fold] = {}  # request key -> its holders' turns, until combined
        deadlines.add("held values' turns", self._next_deadline, self._overdue)

    def __bool__(self) -> bool:
        return bool(self.folds)

    def holds(self, key: str) -> bool:
        return key in self.folds

    def held(self, p: Pending, eid: int, uuid: str, held: Held) -> None:
        """Engine ``eid`` keeps its big value and waits for its turn."""
        if p.key not in self.folds:
            self.folds[p.key] = Fold(p, Turns(p.key, p.reduction.op))
        self.folds[p.key].turns.hold(eid, uuid, held)
        p.state.expect(FOLD, [eid])

    def go(self, p: Pending) -> list[Send]:
        """The turns start once no engine of ``p`` is owed here but the holders."""
        fold = self.folds.get(p.key)
        if fold is None or fold.turns.started or any(isinstance(d, str) and d != FOLD for d in p.state.destinations):
            return []
        turns = fold.turns
        if not turns.holders:
            return self._end(fold)
        why = turns.error() if self.sharing.on else "reduce: engines hold values for a relay that shares no memory"
        segment = self.sharing.value_segment(turns.nbytes) if why is None else None
        if why is None and segment is None:
            why = "reduce: shared memory on this host cannot take the engines' values"
        if why is not None:
            return self._end(fold, why)
        self.inflight.stamp(p, "fold start", len(turns.holders))
        return self._turn(turns.start(segment, self._stripes(fold, segment)), turns)

    def _stripes(self, fold: Fold, segment) -> list[tuple[int, int]] | None:
        """The stripes the holders take their turns in, when this host's value
        goes into a reduce chain or ring and is all the holders' (nothing else
        combines into it): the chain or ring sends each stripe on while the
        next ones combine. A chain's go from the start, the first two chunks,
        each next one twice the one before (up to ``STRIPE_MAX``): the chain
        starts soon, and few turns are taken; two trees' take turns between
        the halves, so that both trees start soon. A ring's go part by part, in
        the order the ring needs them (``Rings.order``). None: one turn each,
        for the whole value."""
        p, turns, chunk = fold.p, fold.turns, self.chunk
        if not p.reduction.empty or not chunk or turns.nbytes <= 2 * chunk:
            return None
        held = turns.holders[min(turns.holders)].held
        header, _ = R.encode(held.value(segment[1]))
        onward = self._onward(p.key)
        if not onward.own_begin(p.key, header, segment[1]):
            return None
        if onward is self.uplinks:  # (each part's stripes in turn: every part's way starts soon)
            each = [stripes(lo, hi, chunk) for lo, hi in self.uplinks.ranges(p.key, turns.nbytes)]
            return [s for turn in zip_longest(*each) for s in turn if s is not None]
        parts, out = self.rings.order(p.key), []
        for lo, hi in parts:  # (the first two chunks, then each part in one or more stripes)
            out += stripes(lo, hi, chunk, 0 if not out else min(hi - lo, STRIPE_MAX))
        return out

    def _onward(self, key: str):
        """Where this host's value goes on: round a ring (an allreduce's), or
        into its parts' links to the leaf (a chain, or two trees: ``uplinks``)."""
        return self.rings if self.rings.has(key) else self.uplinks

    def _turn(self, turn: tuple[str, dict], turns: Turns) -> list[Send]:
        turns.deadline = self.ctx.clock() + self.turn_timeout
        uuid, content = turn
        return [Send(DOWN, [uuid.encode(), P.FOLD_KEY] + self.ctx.codec.pack(P.FOLD_TURN, content))]

    def on_answer(self, uuid: str, body) -> list[Send]:
        """An engine's answer to its turn: the next turn, or the host's value."""
        codec = self.ctx.codec
        answer = codec.content(codec.unpack(body, content=False))
        req = answer.get("req")
        fold = self.folds.get(req) if isinstance(req, str) else None
        if fold is None or not fold.turns.is_answer(uuid, answer):
            return []  # a turn of an earlier round (a holder was dropped meanwhile), or of a request gone
        turns = fold.turns
        if answer.get("ok") is not True:
            return self._drop(fold, turns.turn_of, P.UNREACHABLE, f"could not combine its value: {answer.get('error')}")
        if turns.done():
            return self._end(fold)
        sends, key = self._turn(turns.turn(), turns), fold.p.key
        return sends + (self._onward(key).own_ready(key, turns.ready) + self.settled() if turns.stripes else [])

    def _drop(self, fold: Fold, eid: int, code: str, reason: str) -> list[Send]:
        """A holder is gone: it fails, and the turns start again without it if
        its value may be in the segment."""
        p, turns = fold.p, fold.turns
        uuid, token = turns.holders[eid].uuid, turns.holders[eid].held.token
        again = turns.drop(eid)
        p.reduction.skip(eid)
        sends = self.fail(p, [eid], code, reason)
        if code != P.DIED:  # alive: it lets its value go
            sends.append(self._let_go(uuid, [token]))
        if not turns.holders or (turns.started and not turns.order):
            return sends + self._end(fold)
        if again and turns.stripes and self._onward(p.key).consumed(p.key):  # part of it went on: no new start
            why = f"engine {eid} failed while this host combined its value, part of which had gone on ({reason})"
            sends += self._onward(p.key).abort(p.key, f"reduce chain: {why}")
            return sends + self._end(fold, f"reduce: {why}")
        if not again:
            return sends + self.go(p)
        self.sharing.drop_value(turns.segment[0])  # the turn under way may still write it: a new one
        segment = self.sharing.value_segment(turns.nbytes)
        if segment is None:
            return sends + self._end(fold, "reduce: shared memory on this host cannot take the engines' values")
        return sends + self._turn(turns.start(segment, self._stripes(fold, segment)), turns)

    def _end(self, fold: Fold, error: str | None = None) -> list[Send]:
        """The host's value (or why there is none) joins the reduction in the
        first holder's turn; every holder lets its value go."""
        p, turns = fold.p, fold.turns
        del self.folds[p.key]
        sends = [self._let_go(uuid, tokens) for uuid, tokens in turns.tokens().items()]
        eids = turns.eids
        if eids and error is not None:
            p.reduction.add_error(eids, error, at=eids[0])
        elif eids:
            held, (ref, view) = turns.holders[eids[0]].held, turns.segment
            p.reduction.add(eids, held.value(view), at=eids[0], owned=True, segment=ref)
            self.sharing.values_combined(len(eids))
        for eid in eids[1:]:
            p.reduction.skip(eid)
        if turns.segment is not None:
            p.segments.append(turns.segment[0])  # its name goes when ``p`` is done here, unless passed up
        p.state.answer(FOLD)
        self.inflight.stamp(p, "fold done", error)
        return sends + self.inflight.finish_if_done(p)

    def _let_go(self, uuid: str, tokens: list[str]) -> Send:
        return Send(DOWN, [uuid.encode(), P.FOLD_KEY] + self.ctx.codec.pack(P.FOLD_RELEASE, dict(tokens=tokens)))

    def engine_lost(self, uuid: str, why: str) -> list[Send]:
        """An engine is lost: a holder fails; turns may start (it was owed)."""
        sends = []
        for fold in list(self.folds.values()):
            eid = fold.turns.eid_of(uuid)
            if eid is not None:
                code = P.DIED if why == P.DIED else P.UNREACHABLE
                sends += self._drop(fold, eid, code, f"{why} before its value was combined")
            elif fold.p.key in self.folds:
                sends += self.go(fold.p)
        return sends

    def _overdue(self, now: float) -> list[Send]:
        """Turns past their deadline: that holder is dropped."""
        sends = []
        for fold in list(self.folds.values()):
            turns = fold.turns
            if fold.p.key in self.folds and turns.started and turns.deadline is not None and turns.deadline <= now:
                why = f"did not combine its value within {self.turn_timeout:g} s"
                sends += self._drop(fold, turns.turn_of, P.UNREACHABLE, why)
        return sends

    def _next_deadline(self) -> float | None:
        return min((f.turns.deadline for f in self.folds.values() if f.turns.started), default=None)

    def waiting(self) -> int:
        """Engines' turns still to come, for a survey."""
        return sum(len(f.turns.holders) for f in self.folds.values())
