"""A relay's part in combining the big values its host's engines hold
(``gang``): turns handed out, answers taken, holders that die or stall
dropped, and the host's value folded in. Part of ``RelayNode``; sans I/O."""

from __future__ import annotations

from itertools import zip_longest

from ..wire import protocol as P
from ..wire import reduction as R
from ..wire.reduction import Held
from .events import DOWN, Send
from .gang import Gang
from .pending import Pending
from .state import GANG

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


class GangPath:
    """Holders' turns: ``gangs`` maps a request's key to it while its engines combine."""

    def _gang_held(self, p: Pending, eid: int, uuid: str, held: Held) -> None:
        if p.gang is None:
            p.gang = Gang(p.key, p.reduction.op)
            self.gangs[p.key] = p
        p.gang.hold(eid, uuid, held)
        p.state.expect(GANG, [eid])

    def _gang_go(self, p: Pending) -> list[Send]:
        """The turns start once no engine of ``p`` is owed here but the holders."""
        gang = p.gang
        if gang is None or gang.started or any(isinstance(d, str) and d != GANG for d in p.state.destinations):
            return []
        if not gang.holders:
            return self._gang_end(p)
        why = gang.error() if self.sharing.on else "reduce: engines hold values for a relay that shares no memory"
        segment = self.sharing.value_segment(gang.nbytes) if why is None else None
        if why is None and segment is None:
            why = "reduce: shared memory on this host cannot take the engines' values"
        if why is not None:
            return self._gang_end(p, why)
        self.inflight.stamp(p, "gang start", len(gang.holders))
        return self._gang_turn(gang.start(segment, self._gang_stripes(p, segment)), gang)

    def _gang_stripes(self, p: Pending, segment) -> list[tuple[int, int]] | None:
        """The stripes the holders take their turns in, when this host's value
        goes into a reduce chain or ring and is all the holders' (nothing else
        combines into it): the chain or ring sends each stripe on while the
        next ones combine. A chain's go from the start, the first two chunks,
        each next one twice the one before (up to ``STRIPE_MAX``): the chain
        starts soon, and few turns are taken; two trees' take turns between
        the halves, so that both trees start soon. A ring's go part by part, in
        the order the ring needs them (``Rings.order``). None: one turn each,
        for the whole value."""
        gang, chunk = p.gang, self.chains.chunk
        if not p.reduction.empty or not chunk or gang.nbytes <= 2 * chunk:
            return None
        held = gang.holders[min(gang.holders)].held
        header, _ = R.encode(held.value(segment[1]))
        plane = self._plane(p)
        if not plane.own_begin(p.key, header, segment[1]):
            return None
        if plane is self.uplinks:  # (each part's stripes in turn: every part's way starts soon)
            each = [stripes(lo, hi, chunk) for lo, hi in self.uplinks.ranges(p.key, gang.nbytes)]
            return [s for turn in zip_longest(*each) for s in turn if s is not None]
        parts, out = self.rings.order(p.key), []
        for lo, hi in parts:  # (the first two chunks, then each part in one or more stripes)
            out += stripes(lo, hi, chunk, 0 if not out else min(hi - lo, STRIPE_MAX))
        return out

    def _plane(self, p: Pending):
        """Where this host's value goes on: round a ring (an allreduce's), or
        into its parts' links to the leaf (a chain, or two trees: ``uplinks``)."""
        return self.rings if self.rings.has(p.key) else self.uplinks

    def _gang_turn(self, turn: tuple[str, dict], gang: Gang) -> list[Send]:
        gang.deadline = self.clock() + 2 * self.node_timeout
        uuid, content = turn
        return [Send(DOWN, [uuid.encode(), P.GANG_KEY] + self.codec.pack(P.GANG_TURN, content))]

    def _gang_reply(self, uuid: str, body) -> list[Send]:
        """An engine's answer to its turn: the next turn, or the host's value."""
        answer = self.codec.content(self.codec.unpack(body, content=False))
        req = answer.get("req")
        p = self.gangs.get(req) if isinstance(req, str) else None
        if p is None or not p.gang.is_answer(uuid, answer):
            return []  # a turn of an earlier round (a holder was dropped meanwhile), or of a request gone
        gang = p.gang
        if answer.get("ok") is not True:
            why = f"could not combine its value: {answer.get('error')}"
            return self._gang_drop(p, gang.turn_of, P.UNREACHABLE, why)
        if not gang.done():
            sends = self._gang_turn(gang.turn(), gang)
            return sends + (self._plane(p).own_ready(p.key, gang.ready) + self._ring_settled() if gang.stripes else [])
        return self._gang_end(p)

    def _gang_drop(self, p: Pending, eid: int, code: str, reason: str) -> list[Send]:
        """A holder is gone: it fails, and the turns start again without it if
        its value may be in the segment."""
        gang = p.gang
        uuid, token = gang.holders[eid].uuid, gang.holders[eid].held.token
        again = gang.drop(eid)
        p.reduction.skip(eid)
        sends = self._fail(p, [eid], code, reason)
        if code != P.DIED:  # alive: it lets its value go
            sends.append(self._let_go(uuid, [token]))
        if not gang.holders or (gang.started and not gang.order):
            return sends + self._gang_end(p)
        if again and self._plane(p).consumed(p.key):  # part of the host's value went on: it cannot start again
            why = f"engine {eid} failed while this host combined its value, part of which had gone on ({reason})"
            sends += self._plane(p).abort(p.key, f"reduce chain: {why}")
            return sends + self._gang_end(p, f"reduce: {why}")
        if not again:
            return sends + self._gang_go(p)
        self.sharing.drop_value(gang.segment[0])  # the turn under way may still write it: a new one
        return sends + self._gang_go_again(p)

    def _gang_go_again(self, p: Pending) -> list[Send]:
        gang = p.gang
        segment = self.sharing.value_segment(gang.nbytes)
        if segment is None:
            return self._gang_end(p, "reduce: shared memory on this host cannot take the engines' values")
        return self._gang_turn(gang.start(segment, self._gang_stripes(p, segment)), gang)

    def _gang_end(self, p: Pending, error: str | None = None) -> list[Send]:
        """The host's value (or why there is none) joins ``p``'s reduction in
        the first holder's turn; every holder lets its value go."""
        gang = p.gang
        del self.gangs[p.key]
        p.gang = None
        sends = [self._let_go(uuid, tokens) for uuid, tokens in gang.tokens().items()]
        eids = gang.eids
        if eids and error is not None:
            p.reduction.add_error(eids, error, at=eids[0])
        elif eids:
            held, (ref, view) = gang.holders[eids[0]].held, gang.segment
            p.reduction.add(eids, held.value(view), at=eids[0], owned=True, segment=ref)
            self.sharing.values_taken += len(eids)
        for eid in eids[1:]:
            p.reduction.skip(eid)
        if gang.segment is not None:
            p.segments.append(gang.segment[0])  # its name goes when ``p`` is done here, unless passed up
        p.state.answer(GANG)
        self.inflight.stamp(p, "gang done", error)
        return sends + self.inflight.finish_if_done(p)

    def _let_go(self, uuid: str, tokens: list[str]) -> Send:
        return Send(DOWN, [uuid.encode(), P.GANG_KEY] + self.codec.pack(P.GANG_RELEASE, dict(tokens=tokens)))

    def _gangs_after_loss(self, uuid: str, why: str) -> list[Send]:
        """An engine is lost: a holder fails; turns may start (it was owed)."""
        sends = []
        for p in list(self.gangs.values()):
            eid = p.gang.eid_of(uuid)
            if eid is not None:
                code = P.DIED if why == P.DIED else P.UNREACHABLE
                sends += self._gang_drop(p, eid, code, f"{why} before its value was combined")
            elif p.gang is not None:
                sends += self._gang_go(p)
        return sends

    def _gang_tick(self, now: float) -> list[Send]:
        """Turns past their deadline: that holder is dropped."""
        sends = []
        for p in list(self.gangs.values()):
            gang = p.gang
            if gang is not None and gang.started and gang.deadline is not None and gang.deadline <= now:
                why = f"did not combine its value within {2 * self.node_timeout:g} s"
                sends += self._gang_drop(p, gang.turn_of, P.UNREACHABLE, why)
        return sends

    def _gang_deadline(self) -> float | None:
        return min((p.gang.deadline for p in self.gangs.values() if p.gang.started), default=None)

    # ------------------------------------------- values in this host's memory
    def _value_taker(self, p: Pending):
        """How ``p``'s children of this host hand up values in segments."""
        if not self.sharing.on:
            return None

        def take(content):
            view = self.sharing.take_value(content)
            p.segments.append(content)
            return view

        return take

    def _drop_values(self, p: Pending) -> None:
        """``p`` is done here: the names of the segments its values were in
        go (those passed up are the reader's now)."""
        for content in p.segments:
            self.sharing.drop_value(content)
