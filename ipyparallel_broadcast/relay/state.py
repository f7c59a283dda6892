"""A request's life at one relay node, as one state object with its
transitions in one place (in the style of h11's ``_state.py``).

``RequestState`` holds what the request still waits for: per destination
(an engine's uuid, a child's key, ``PARKED`` for engines the leaf must look
up, ``AWAITING_DATA`` while a host relay's chunks come, ``FOLD`` while engines
of this host combine the big reduce values they hold) the engines owed from
it, and its ``Phase``::

    RECEIVED ──await_data──▶ AWAITING_DATA ──data_came──▶ (dispatch)
       │                                                      │
       └──expect──▶ IN_FLIGHT ──answer / give_up──▶ PARTLY_ANSWERED ──▶ COMPLETE
                                                        (every target's outcome in)

A target's outcome is a reply (``answer``, ``answer_some``) or a failure
(``give_up``: the engine died, the child was lost, the data never came, the
engine is unknown; ``settle_via``: one engine a host relay owes). Targets
failed before anything is sent on (not served here) are never owed. ``finish``
ends it once nothing is owed; after that any transition raises
``StateError``. Only this module changes the table; the rest of the relay
reads it through ``owes`` and ``complete``.
"""

from __future__ import annotations

from enum import Enum

PARKED = "?"  # engines whose uuid the leaf must look up at the hub
AWAITING_DATA = "~bulk"  # a host relay's targets, until the request's chunks are in
FOLD = "~fold"  # engines of this host holding big reduce values, until they are combined (``hostfold``)


class Phase(Enum):
    RECEIVED = "received"
    AWAITING_DATA = "awaiting data"
    IN_FLIGHT = "in flight"
    PARTLY_ANSWERED = "partly answered"
    COMPLETE = "complete"


ALLOWED = {  # phase -> phases it may move to
    Phase.RECEIVED: {Phase.AWAITING_DATA, Phase.IN_FLIGHT, Phase.PARTLY_ANSWERED, Phase.COMPLETE},
    Phase.AWAITING_DATA: {Phase.IN_FLIGHT, Phase.PARTLY_ANSWERED, Phase.COMPLETE},
    Phase.IN_FLIGHT: {Phase.PARTLY_ANSWERED, Phase.COMPLETE},
    Phase.PARTLY_ANSWERED: {Phase.COMPLETE},
    Phase.COMPLETE: set(),
}


class StateError(RuntimeError):
    """A transition the request's phase does not allow (a bug, not bad input)."""


class RequestState:
    __slots__ = ("_owed", "phase", "history", "settled")

    def __init__(self):
        self._owed: dict[object, set[int]] = {}
        self.phase = Phase.RECEIVED
        self.history = [Phase.RECEIVED]  # every phase it went through, in order
        self.settled: set[int] = set()  # engines a host relay owed, failed here (they may still answer)

    # -------------------------------------------------------------- reading
    def owes(self, dest) -> bool:
        return dest in self._owed

    def owed_from(self, dest) -> frozenset:
        return frozenset(self._owed.get(dest, ()))

    @property
    def complete(self) -> bool:
        return not self._owed

    @property
    def destinations(self) -> list:
        return list(self._owed)

    # ---------------------------------------------------------- transitions
    def _move(self, phase: Phase):
        if phase is not self.phase:
            if phase not in ALLOWED[self.phase]:
                raise StateError(f"a request {self.phase.value} cannot become {phase.value}")
            self.phase = phase
            self.history.append(phase)

    def _live(self):
        if self.phase is Phase.COMPLETE:
            raise StateError("the request is complete")

    def _outcome(self):
        """Some target's outcome is in: partly answered, unless all are."""
        if self.phase is not Phase.PARTLY_ANSWERED:
            self._move(Phase.PARTLY_ANSWERED)

    def expect(self, dest, eids):
        """Sent on to ``dest``, which owes ``eids``."""
        self._live()
        self._owed.setdefault(dest, set()).update(eids)
        if self.phase in (Phase.RECEIVED, Phase.AWAITING_DATA):
            self._move(Phase.IN_FLIGHT)

    def await_data(self, eids):
        """A host relay: ``eids`` wait for the request's chunks."""
        self._live()
        self._owed[AWAITING_DATA] = set(eids)
        self._move(Phase.AWAITING_DATA)

    def data_came(self) -> list[int]:
        """The chunks are in: the engines to send the request to now."""
        self._live()
        return sorted(self._owed.pop(AWAITING_DATA, ()))

    def park(self, eids):
        """A leaf: ``eids`` wait while their uuids are looked up."""
        self.expect(PARKED, eids)

    def unpark(self) -> list[int]:
        """The parked engines, to try again (``park`` the ones still unknown)."""
        self._live()
        return sorted(self._owed.pop(PARKED, ()))

    def answer(self, dest) -> set[int]:
        """``dest`` answered for everything it owed: those engines (a set, not
        sorted: a leaf's 16 host bundles a call would sort every engine)."""
        self._live()
        eids = self._owed.pop(dest)
        self._outcome()
        return eids

    def answer_some(self, dest, eids) -> bool:
        """A streamed bundle from ``dest`` for ``eids``; False if it names an
        engine ``dest`` does not owe (those a host relay owed and that were
        failed here meanwhile are tolerated)."""
        self._live()
        owed = self._owed.get(dest)
        if owed is None or not set(eids) <= owed | self.settled:
            return False
        owed.difference_update(eids)
        if not owed:
            del self._owed[dest]
        self._outcome()
        return True

    def give_up(self, dest) -> list[int]:
        """Nothing more will come from ``dest``: the engines it owed, to fail."""
        self._live()
        eids = self._owed.pop(dest, None)
        if eids:
            self._outcome()
        return sorted(eids or ())

    def settle_via(self, host, eid) -> bool:
        """Fail one engine that host relay ``host`` owes; False if it owes none such."""
        self._live()
        owed = self._owed.get(host)
        if not owed or eid not in owed:
            return False
        owed.discard(eid)
        if not owed:
            del self._owed[host]
        self.settled.add(eid)
        self._outcome()
        return True

    def finish(self):
        """Every target's outcome is in."""
        if self._owed:
            raise StateError(f"the request still waits for {sorted(self._owed, key=str)}")
        self._move(Phase.COMPLETE)
