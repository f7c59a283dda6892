"""The big reduce values the engines of this relay's host hold, combined
where they are: one segment, the engines in turn (sans I/O).

An engine of this host keeps a big value and answers with a ``Held`` (see
``engine.holds``). Once no engine of the request is still owed here, the relay
makes one segment of the value's size and gives the holders turns in the order
of their engine ids: the first copies its value in, each next one combines its
own into it. So a host's value costs one segment, whatever the number of its
engines, and each value is read once, by its own engine. The segment is then
this relay's part for those engines, combined in place from there on.

With ``stripes`` (each a byte range ``(lo, hi)``), the turns go stripe by
stripe (every holder's turn for the first stripe, then for the next ...):
each stripe of the host's value is final as soon as its last turn is done
(``ready``), so a reduce chain or ring can send it on while the rest is still
combined. The order of the values in each element is the same either way.

A holder that dies, fails its turn or takes longer than its deadline is named
and dropped, and the turns start again without it (the first copies: nothing
of its value stays). ``Turns`` only keeps the order; ``hostfold`` sends.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..wire.reduction import Held, mismatch


@dataclass
class Holder:
    uuid: str
    held: Held


class Turns:
    """One request's holders at one relay, and whose turn it is."""

    def __init__(self, key: str, op: str):
        self.key, self.op = key, op
        self.holders: dict[int, Holder] = {}  # engine id -> its holder
        self.order: list[int] = []  # the holders in turn, once started
        self.stripes: list[tuple[int, int]] | None = None  # byte ranges, in turn (None: one turn each, for the whole)
        self.at = -1  # the index in ``steps`` of the turn under way (-1: not started)
        self.segment = None  # (reference content, writable view), once started
        self.round = 0  # turns started again (a holder dropped) start a new round, in a new segment
        self.deadline: float | None = None  # the turn under way must be done by then

    def hold(self, eid: int, uuid: str, held: Held) -> None:
        self.holders[eid] = Holder(uuid, held)

    @property
    def started(self) -> bool:
        return self.at >= 0

    @property
    def eids(self) -> list[int]:
        return sorted(self.holders)

    def error(self) -> str | None:
        """Why the held values cannot be combined (different kinds), or None."""
        first = self.holders[min(self.holders)].held
        other = [e for e, h in self.holders.items() if h.held.sig != first.sig]
        if not other:
            return None
        same = [e for e in self.holders if e not in other]
        return mismatch(self.op, same, first.sig, other, self.holders[other[0]].held.sig)

    @property
    def nbytes(self) -> int:
        return self.holders[min(self.holders)].held.nbytes

    def start(self, segment, stripes: list[tuple[int, int]] | None = None) -> tuple[str, dict]:
        """The holders take turns in ``segment`` (stripe by stripe, with
        ``stripes``): the first turn (``turn``)."""
        self.segment, self.order, self.at, self.stripes = segment, self.eids, 0, stripes
        self.round += 1
        return self.turn()

    @property
    def steps(self) -> int:
        return (1 if self.stripes is None else len(self.stripes)) * len(self.order)

    def _lo(self, stripe: int) -> int | None:
        return None if self.stripes is None else self.stripes[stripe][0]

    def turn(self) -> tuple[str, dict]:
        """``(uuid, FOLD_TURN content)`` of the turn under way."""
        stripe, k = divmod(self.at, len(self.order))
        holder = self.holders[self.order[k]]
        content = dict(
            req=self.key,
            round=self.round,
            token=holder.held.token,
            ref=self.segment[0],
            op=self.op,
            dtype=holder.held.dtype,
            first=k == 0,
        )
        if self.stripes is not None:
            content.update(lo=self.stripes[stripe][0], hi=self.stripes[stripe][1])
        return holder.uuid, content

    @property
    def turn_of(self) -> int | None:
        """The engine whose turn is under way."""
        return self.order[self.at % len(self.order)] if self.started and self.at < self.steps else None

    @property
    def ready(self) -> list[tuple[int, int]]:
        """The byte ranges of the host's value that are final (every holder's turn for them is done)."""
        if not self.started or not self.order:
            return []
        if self.stripes is None:
            return [(0, self.nbytes)] if self.at >= self.steps else []
        return self.stripes[: self.at // len(self.order)]

    def done(self) -> bool:
        """The turn under way is done: True if it was the last."""
        self.at += 1
        return self.at >= self.steps

    def drop(self, eid: int) -> bool:
        """``eid`` is gone (dead, or its turn failed): True if the turns must
        start again, in a new segment (its value may be in this one already,
        and a turn may still be writing it)."""
        self.holders.pop(eid)
        if not self.started:
            return False
        spoiled = self.order.index(eid) <= self.at  # (its first turn is in the first stripe)
        self.order.remove(eid)
        return spoiled and bool(self.order)

    def is_answer(self, uuid: str, answer: dict) -> bool:
        """Whether ``answer`` ends the turn under way (not an earlier round's)."""
        eid = self.turn_of
        holder = self.holders.get(eid) if eid is not None else None
        lo = self._lo(self.at // len(self.order)) if eid is not None else None
        return (
            holder is not None
            and holder.uuid == uuid
            and answer.get("round") == self.round
            and answer.get("token") == holder.held.token
            and answer.get("lo") == lo
        )

    def eid_of(self, uuid: str) -> int | None:
        return next((e for e, h in self.holders.items() if h.uuid == uuid), None)

    def tokens(self) -> dict[str, list[str]]:
        """Each holder's tokens, to let go: ``{uuid: [token]}``."""
        out: dict[str, list[str]] = {}
        for holder in self.holders.values():
            out.setdefault(holder.uuid, []).append(holder.held.token)
        return out
