"""``OutstandingIds`` reads and edits exactly as ipyparallel's set of msg_ids
(one per engine per call), whatever is done to it, while it keeps a
broadcast as one entry: the client's work per call does not grow with the
engines in ``outstanding``."""

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from traitlets import HasTraits, TraitError

from ipyparallel_broadcast.client.history import CallHistory
from ipyparallel_broadcast.client.outstanding import Outstanding, OutstandingIds
from ipyparallel_broadcast.wire.naming import BROADCAST_ID_PREFIX, engine_vid

pytestmark = pytest.mark.pure

UUIDS = ["1f0c-aa", "2b3d-bb", "3e4f-cc", "4a5b-dd"]
# broadcast ids as the client makes them (a session's msg_id holds "_"), and others
calls = st.sampled_from([f"{BROADCAST_ID_PREFIX}s1_7_{n}" for n in range(4)])
plain = st.sampled_from(["d1", "d2", "s1_7_9"])
vids = st.builds(engine_vid, calls, st.sampled_from(UUIDS))
any_id = st.one_of(calls, plain, vids)
targets = st.lists(st.sampled_from(UUIDS), min_size=1, max_size=4, unique=True)


class OutstandingAgainstSet(RuleBasedStateMachine):
    """Every operation on an OutstandingIds and on the set it stands for."""

    def __init__(self):
        super().__init__()
        self.ids, self.model = OutstandingIds(), set()

    @rule(msg_id=calls, uuids=targets)
    def add_call(self, msg_id, uuids):
        self.ids.add_call(msg_id, uuids)
        self.model.update(engine_vid(msg_id, u) for u in uuids)

    @rule(msg_id=calls, uuids=targets)
    def settle(self, msg_id, uuids):
        self.ids.settle(msg_id, uuids)
        self.model.difference_update(engine_vid(msg_id, u) for u in uuids)

    @rule(msg_id=calls)
    def drop_call(self, msg_id):
        self.ids.drop_call(msg_id)
        self.model = {i for i in self.model if not i.startswith(msg_id + "_")}

    @rule(item=any_id)
    def add(self, item):
        self.ids.add(item)
        self.model.add(item)

    @rule(item=any_id)
    def discard(self, item):
        self.ids.discard(item)
        self.model.discard(item)

    @rule(items=st.lists(any_id, max_size=5))
    def update(self, items):
        self.ids.update(items)
        self.model.update(items)

    @rule(items=st.lists(any_id, max_size=5))
    def difference_update(self, items):
        self.ids.difference_update(items)
        self.model.difference_update(items)

    @rule(items=st.lists(any_id, max_size=8))
    def intersection_update_with_a_set(self, items):
        self.ids.intersection_update(items)
        self.model.intersection_update(items)

    @rule(msg_id=calls, uuids=targets, items=st.lists(any_id, max_size=5))
    def intersection_update_with_another(self, msg_id, uuids, items):
        other = OutstandingIds(items)
        other.add_call(msg_id, uuids)
        expect = set(items) | {engine_vid(msg_id, u) for u in uuids}
        self.ids.intersection_update(other)
        self.model.intersection_update(expect)

    @rule(msg_id=calls, uuids=targets)
    def update_from_a_history(self, msg_id, uuids):
        history = CallHistory(["d1"])
        history.add_call(msg_id, uuids)
        self.ids.update(history)
        self.model.update(history)

    @rule(item=any_id)
    def contains(self, item):
        assert (item in self.ids) == (item in self.model)

    @invariant()
    def reads_as_the_set(self):
        listed = list(self.ids)
        assert len(listed) == len(set(listed)), "an id listed twice"
        assert set(listed) == self.model
        assert len(self.ids) == len(self.model)
        assert bool(self.ids) == bool(self.model)
        assert self.ids == self.model
        assert self.ids.intersection({"d1", "d2"}) == self.model & {"d1", "d2"}
        assert self.ids.difference({"d1"}) == self.model - {"d1"}
        assert (self.ids | {"x"}) == self.model | {"x"}
        assert isinstance(self.ids & {"d1"}, set)


TestOutstandingAgainstSet = OutstandingAgainstSet.TestCase
TestOutstandingAgainstSet.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)


def test_a_broadcast_is_one_entry_whatever_its_engines():
    ids = OutstandingIds()
    uuids = [f"u{k:04d}" for k in range(1024)]
    ids.add_call("ipb-a_1_1", uuids)
    assert len(ids._calls) == 1 and not ids._plain
    assert len(ids) == 1024 and engine_vid("ipb-a_1_1", "u0007") in ids
    ids.settle("ipb-a_1_1", uuids[:1000])
    assert len(ids) == 24
    ids.drop_call("ipb-a_1_1")
    assert not ids and not ids._calls


def test_the_trait_takes_a_set_and_refuses_other_things():
    class Owner(HasTraits):
        outstanding = Outstanding()

    owner = Owner()
    assert isinstance(owner.outstanding, OutstandingIds)
    owner.outstanding = {"a", engine_vid("ipb-c_1_1", "u1")}
    assert isinstance(owner.outstanding, OutstandingIds) and owner.outstanding == {"a", "ipb-c_1_1_u1"}
    with pytest.raises(TraitError):
        owner.outstanding = 3
