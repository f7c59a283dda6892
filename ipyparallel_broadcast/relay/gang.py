"""The big reduce values the engines of this relay's host hold, combined
where they are: one segment, the engines in turn (sans I/O).

An engine of this host keeps a big value and answers with a ``Held`` (see
``engine.holds``). Once no engine of the request is still owed here, the relay
makes one segment of the value's size and gives the holders turns in the order
of their engine ids: the first copies its value in, each next one combines its
own into it. So a host's value costs one segment, whatever the number of its
engines, and each value is read once, by its own engine. The segment is then
this relay's part for those engines, combined in place from there on.

A holder that dies, fails its turn or takes longer than its deadline is named
and dropped, and the turns start again without it (the first copies: nothing
of its value stays). ``Gang`` only keeps the order; ``gangpath`` sends.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..wire.reduction import Held, mismatch


@dataclass
class Holder:
    uuid: str
    held: Held


class Gang:
    """One request's holders at one relay, and whose turn it is."""

    def __init__(self, key: str, op: str):
        self.key, self.op = key, op
        self.holders: dict[int, Holder] = {}  # engine id -> its holder
        self.order: list[int] = []  # turns, once started
        self.at = -1  # the index in ``order`` of the turn under way (-1: not started)
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

    def start(self, segment) -> tuple[str, dict]:
        """The holders take turns in ``segment``: the first turn (``turn``)."""
        self.segment, self.order, self.at = segment, self.eids, 0
        self.round += 1
        return self.turn()

    def turn(self) -> tuple[str, dict]:
        """``(uuid, GANG_TURN content)`` of the turn under way."""
        eid = self.order[self.at]
        holder = self.holders[eid]
        content = dict(
            req=self.key,
            round=self.round,
            token=holder.held.token,
            ref=self.segment[0],
            op=self.op,
            dtype=holder.held.dtype,
            first=self.at == 0,
        )
        return holder.uuid, content

    @property
    def turn_of(self) -> int | None:
        """The engine whose turn is under way."""
        return self.order[self.at] if self.started and self.at < len(self.order) else None

    def done(self) -> bool:
        """The turn under way is done: True if it was the last."""
        self.at += 1
        return self.at == len(self.order)

    def drop(self, eid: int) -> bool:
        """``eid`` is gone (dead, or its turn failed): True if the turns must
        start again, in a new segment (its value may be in this one already,
        and a turn may still be writing it)."""
        self.holders.pop(eid)
        if not self.started:
            return False
        spoiled = self.order.index(eid) <= self.at
        self.order.remove(eid)
        return spoiled and bool(self.order)

    def is_answer(self, uuid: str, answer: dict) -> bool:
        """Whether ``answer`` ends the turn under way (not an earlier round's)."""
        holder = self.holders.get(self.order[self.at]) if self.started and self.at < len(self.order) else None
        return (
            holder is not None
            and holder.uuid == uuid
            and answer.get("round") == self.round
            and answer.get("token") == holder.held.token
        )

    def eid_of(self, uuid: str) -> int | None:
        return next((e for e, h in self.holders.items() if h.uuid == uuid), None)

    def tokens(self) -> dict[str, list[str]]:
        """Each holder's tokens, to let go: ``{uuid: [token]}``."""
        out: dict[str, list[str]] = {}
        for holder in self.holders.values():
            out.setdefault(holder.uuid, []).append(holder.held.token)
        return out
