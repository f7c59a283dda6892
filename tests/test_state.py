"""A request's state at a relay node (``relay.state``): its transitions
against a plain model (hypothesis state machine), and the phases every
request goes through in whole simulated trees, faults included."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from treesim import TreeSim

from ipyparallel_broadcast.relay.state import ALLOWED, AWAITING_DATA, PARKED, Phase, RequestState, StateError

pytestmark = pytest.mark.pure

ENGINES = list(range(12))
DESTS = ["uuid-a", "uuid-b", 0, 1, b"host-1", PARKED]


class Model(RuleBasedStateMachine):
    """``RequestState`` against a dict of what each destination owes."""

    def __init__(self):
        super().__init__()
        self.state = RequestState()
        self.owed = {}  # dest -> set of eids
        self.free = set(ENGINES)  # engines not yet owed: a target is owed by one destination
        self.outcomes = []  # every eid whose outcome came in, in order

    def _take(self, data, at_least=1):
        eids = data.draw(st.sets(st.sampled_from(sorted(self.free)), min_size=at_least, max_size=4))
        self.free -= eids
        return eids

    @precondition(lambda self: self.free and self.state.phase is not Phase.COMPLETE)
    @rule(dest=st.sampled_from(DESTS), data=st.data())
    def expect(self, dest, data):
        eids = self._take(data)
        self.state.expect(dest, eids)
        self.owed.setdefault(dest, set()).update(eids)

    @precondition(lambda self: self.free and self.state.phase in (Phase.RECEIVED,))
    @rule(data=st.data())
    def await_data(self, data):
        eids = self._take(data)
        self.state.await_data(eids)
        self.owed[AWAITING_DATA] = eids

    @precondition(lambda self: AWAITING_DATA in self.owed)
    @rule(dest=st.sampled_from(["uuid-a", 0]))
    def data_came(self, dest):
        eids = self.state.data_came()
        assert eids == sorted(self.owed.pop(AWAITING_DATA))
        self.state.expect(dest, eids)
        self.owed.setdefault(dest, set()).update(eids)

    @precondition(lambda self: PARKED in self.owed)
    @rule(found=st.booleans())
    def unpark(self, found):
        eids = self.state.unpark()
        assert eids == sorted(self.owed.pop(PARKED))
        if found:  # their uuids came: each engine is sent the request
            for e in eids:
                self.state.expect(f"uuid-{e}", {e})
                self.owed[f"uuid-{e}"] = {e}
        else:
            self.state.park(eids)
            self.owed[PARKED] = set(eids)

    @precondition(lambda self: any(d != AWAITING_DATA for d in self.owed))
    @rule(data=st.data())
    def answer(self, data):
        dest = data.draw(st.sampled_from(sorted((d for d in self.owed if d != AWAITING_DATA), key=str)))
        assert sorted(self.state.answer(dest)) == sorted(self.owed[dest])
        self.outcomes += sorted(self.owed.pop(dest))

    @precondition(lambda self: self.owed)
    @rule(data=st.data())
    def answer_some(self, data):
        dest = data.draw(st.sampled_from(sorted(self.owed, key=str)))
        some = data.draw(st.sets(st.sampled_from(sorted(self.owed[dest])), min_size=1))
        assert self.state.answer_some(dest, some)
        self.owed[dest] -= some
        if not self.owed[dest]:
            del self.owed[dest]
        self.outcomes += sorted(some)

    @precondition(lambda self: self.state.phase is not Phase.COMPLETE)
    @rule(dest=st.sampled_from(DESTS + [AWAITING_DATA]))
    def give_up(self, dest):
        assert self.state.give_up(dest) == sorted(self.owed.pop(dest, ()))

    @precondition(lambda self: self.state.phase is not Phase.COMPLETE)
    @rule(eid=st.sampled_from(ENGINES))
    def settle_via_host(self, eid):
        owes = eid in self.owed.get(b"host-1", ())
        assert self.state.settle_via(b"host-1", eid) == owes
        if owes:
            self.owed[b"host-1"].discard(eid)
            if not self.owed[b"host-1"]:
                del self.owed[b"host-1"]

    @precondition(lambda self: self.state.phase is not Phase.COMPLETE)
    @rule(dest=st.sampled_from(DESTS), eid=st.sampled_from(ENGINES))
    def a_bundle_naming_an_engine_not_owed_is_refused(self, dest, eid):
        if eid in self.owed.get(dest, ()) or eid in self.state.settled:
            return
        assert self.state.answer_some(dest, [eid]) is False

    @rule()
    def finish(self):
        if self.owed:
            with pytest.raises(StateError):
                self.state.finish()
            return
        self.state.finish()
        assert self.state.phase is Phase.COMPLETE
        for touch in (lambda s: s.expect("x", {99}), lambda s: s.answer("uuid-a"), lambda s: s.give_up(0)):
            with pytest.raises(StateError):
                touch(self.state)

    @invariant()
    def agrees_with_the_model(self):
        assert self.state.complete == (not self.owed)
        for dest, eids in self.owed.items():
            assert self.state.owes(dest) and self.state.owed_from(dest) == eids
        assert sorted(self.state.destinations, key=str) == sorted(self.owed, key=str)

    @invariant()
    def moves_only_as_allowed(self):
        history = self.state.history
        assert history[0] is Phase.RECEIVED
        assert all(b in ALLOWED[a] for a, b in zip(history, history[1:]))


TestRequestStateMachine = Model.TestCase
TestRequestStateMachine.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)


def _phases_are_sound(sim, requests_seen):
    assert len(sim.finished) == requests_seen
    for history in sim.finished:
        assert history[0] is Phase.RECEIVED and history[-1] is Phase.COMPLETE
        assert all(b in ALLOWED[a] for a, b in zip(history, history[1:]))


shapes = st.sampled_from([(0, 2), (1, 2), (2, 2), (1, 3)])


@settings(max_examples=40, deadline=None)
@given(shapes, st.lists(st.sampled_from(ENGINES), unique=True, min_size=1), st.data(), st.booleans())
def test_every_request_ends_complete_at_every_node_with_engines_dying(shape, targets, data, stream):
    sim = TreeSim(*shape, ENGINES)
    dead = data.draw(st.lists(st.sampled_from(targets), unique=True))
    sim.hold.update(dead)
    sim.request(targets, stream=stream)
    for eid in dead:
        sim.kill(eid)
    replies, failures, _ = sim.outcomes()
    assert sorted(replies) == sorted(set(targets) - set(dead)) and sorted(failures) == sorted(dead)
    assert sim.pending_total() == 0
    _phases_are_sound(sim, sum(len(inbox) for inbox in sim.node_inbox.values()))
    assert any(Phase.PARTLY_ANSWERED in h for h in sim.finished)
