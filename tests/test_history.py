"""``CallHistory`` reads exactly as ipyparallel's list of msg_ids (one per
engine per call), whatever is done to it, while it keeps a broadcast as one
entry: the client's memory per call does not grow with the engines."""

import sys

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from traitlets import HasTraits, TraitError

from ipyparallel_broadcast.client.history import CallHistory, History
from ipyparallel_broadcast.wire.naming import engine_vid

pytestmark = pytest.mark.pure

UUIDS = ["1f0c-aa", "2b3d-bb", "3e4f-cc", "4a5b-dd"]
msg_ids = st.text("abcdef0123456789-", min_size=1, max_size=12)


class HistoryAgainstList(RuleBasedStateMachine):
    """Every operation on a CallHistory and on the list it stands for."""

    def __init__(self):
        super().__init__()
        self.history, self.ids = CallHistory(), []

    @rule(msg_id=msg_ids)
    def append(self, msg_id):
        self.history.append(msg_id)
        self.ids.append(msg_id)

    @rule(msg_id=msg_ids, uuids=st.lists(st.sampled_from(UUIDS), max_size=4, unique=True))
    def add_call(self, msg_id, uuids):
        self.history.add_call(msg_id, uuids)
        self.ids.extend(engine_vid(msg_id, u) for u in uuids)

    @rule(start=st.integers(-2, 40))
    def tail_extends_another(self, start):
        other = CallHistory(["x"])
        other.extend(self.history.tail(start))
        assert list(other) == ["x"] + self.ids[max(0, start) :]

    @precondition(lambda self: self.ids)
    @rule(data=st.data())
    def index(self, data):
        i = data.draw(st.integers(-len(self.ids), len(self.ids) - 1))
        assert self.history[i] == self.ids[i]

    @rule(start=st.integers(-10, 10), stop=st.integers(-10, 10) | st.none())
    def slice(self, start, stop):
        assert self.history[start:stop] == self.ids[start:stop]

    @precondition(lambda self: self.ids)
    @rule(data=st.data())
    def contains(self, data):
        present = data.draw(st.sampled_from(self.ids))
        assert present in self.history
        assert (present + "0" in self.history) == (present + "0" in self.ids)

    @precondition(lambda self: self.ids)
    @rule(data=st.data(), value=msg_ids)
    def edit(self, data, value):
        i = data.draw(st.integers(0, len(self.ids) - 1))
        self.history[i] = value
        self.ids[i] = value
        del self.history[0]
        del self.ids[0]
        self.history.insert(i, value)
        self.ids.insert(i, value)

    @invariant()
    def reads_as_the_list(self):
        assert len(self.history) == len(self.ids)
        assert list(self.history) == self.ids and self.history == self.ids
        assert list(reversed(self.history)) == self.ids[::-1]


TestHistoryAgainstList = HistoryAgainstList.TestCase
TestHistoryAgainstList.settings = settings(max_examples=200, stateful_step_count=30, deadline=None)


def test_out_of_range_and_foreign_ids():
    history = CallHistory(["a"])
    with pytest.raises(IndexError):
        history[1]
    with pytest.raises(IndexError):
        history[-2]
    assert None not in history and 3 not in history


def test_a_broadcast_is_one_entry_however_many_engines():
    """10,000 calls to 1,000 engines: ten million ids, ~10,000 entries kept."""
    uuids = [f"uuid{i:04d}" for i in range(1000)]
    history = CallHistory()
    before = sys.getallocatedblocks()
    for i in range(10_000):
        history.add_call(f"msg{i}", uuids)
    blocks = sys.getallocatedblocks() - before
    assert len(history) == 10_000_000
    assert history[-1] == engine_vid("msg9999", "uuid0999")
    assert blocks < 3 * 10_000  # one tuple per call (its msg_id is the call's); the uuids once


def test_the_trait_turns_an_assigned_list_into_a_call_history():
    """ipyparallel's ``purge_everything`` assigns ``[]``."""

    class Owner(HasTraits):
        history = History()

    owner = Owner()
    assert isinstance(owner.history, CallHistory) and len(owner.history) == 0
    owner.history = ["a", "b"]
    assert isinstance(owner.history, CallHistory) and owner.history == ["a", "b"]
    with pytest.raises(TraitError):
        owner.history = "ab"


class BoundedHistoryAgainstList(HistoryAgainstList):
    """With a limit, the history reads as the list's last ids: every index
    still names the id it named, and a forgotten one raises IndexError."""

    LIMIT = 5

    def __init__(self):
        super().__init__()
        self.history = CallHistory(limit=self.LIMIT)

    def kept_from(self) -> int:
        return self.history.forgotten

    @invariant()
    def reads_as_the_list(self):
        head = self.kept_from()
        assert len(self.history) == len(self.ids)
        assert len(self.history._items) <= self.LIMIT
        assert list(self.history) == self.ids[head:]
        assert list(reversed(self.history)) == self.ids[head:][::-1]
        if head:
            with pytest.raises(IndexError, match="forgotten"):
                self.history[head - 1]

    @rule(start=st.integers(-2, 40))
    def tail_extends_another(self, start):
        other = CallHistory(["x"])
        other.extend(self.history.tail(start))
        assert list(other) == ["x"] + self.ids[max(self.kept_from(), start) :]

    @precondition(lambda self: self.ids)
    @rule(data=st.data())
    def index(self, data):
        i = data.draw(st.integers(-len(self.ids), len(self.ids) - 1))
        if (i + len(self.ids) if i < 0 else i) >= self.kept_from():
            assert self.history[i] == self.ids[i]

    @rule(start=st.integers(-10, 10), stop=st.integers(-10, 10) | st.none())
    def slice(self, start, stop):
        kept = range(*slice(start, stop).indices(len(self.ids)))
        assert self.history[start:stop] == [self.ids[i] for i in kept if i >= self.kept_from()]

    @precondition(lambda self: self.ids)
    @rule(data=st.data())
    def contains(self, data):
        present = data.draw(st.sampled_from(self.ids))
        assert (present in self.history) == (present in self.ids[self.kept_from() :])

    @precondition(lambda self: False)
    @rule()
    def edit(self):
        """Editing (rare: purges) renumbers a bounded history; not modelled."""


TestBoundedHistoryAgainstList = BoundedHistoryAgainstList.TestCase
TestBoundedHistoryAgainstList.settings = settings(max_examples=200, stateful_step_count=30, deadline=None)


def test_a_bounded_history_stays_small_over_many_calls():
    history = CallHistory(limit=100)
    for k in range(10_000):
        history.add_call(f"call-{k}", UUIDS)
    assert len(history) == 40_000 and history.forgotten >= 40_000 - 4 * 100
    assert len(history._items) <= 100
    assert history[-1] == engine_vid("call-9999", UUIDS[-1])


def test_assigning_a_list_keeps_the_limit():
    class Holder(HasTraits):
        h = History()

    holder = Holder()
    holder.h.limit = 7
    holder.h = ["a", "b"]
    assert isinstance(holder.h, CallHistory) and holder.h.limit == 7
