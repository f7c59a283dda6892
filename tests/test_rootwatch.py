"""The client's watch on the root, without sockets."""

import pytest
from cluster_util import Clock
from hypothesis import given
from hypothesis import strategies as st

from ipyparallel_broadcast.client.replies import LOST, RootWatch

pytestmark = pytest.mark.pure


def watch(**kw):
    clock = Clock()
    return RootWatch(interval=0.5, timeout=10, clock=clock, **kw), clock


def test_nothing_in_flight_sends_no_pings():
    w, clock = watch()
    clock.now = 100
    assert w.tick() == ([], [])


def test_only_requests_waited_on_for_an_interval_are_asked_about():
    w, clock = watch()
    w.sent("a")
    assert w.tick() == ([], [])
    clock.now = 0.4
    w.sent("b")
    clock.now = 0.6
    assert w.tick() == (["a"], [])
    clock.now = 1.0
    assert w.tick() == (["a", "b"], [])
    w.done("a")
    assert w.tick() == (["b"], [])


def test_what_the_root_does_not_hold_is_lost_once():
    w, clock = watch()
    for m in "abc":
        w.sent(m)
    clock.now = 1
    assert w.tick()[0] == ["a", "b", "c"]
    assert w.pong(["b", "zzz", 7]) == [("b", LOST)]  # unknown ids and junk are ignored
    assert w.pong(["b"]) == []
    assert w.tick()[0] == ["a", "c"]


def test_a_silent_root_loses_what_was_asked_about_after_the_timeout():
    w, clock = watch()
    w.sent("a")
    clock.now = 1
    assert w.tick() == (["a"], [])
    clock.now = 5
    w.sent("b")  # sent after the unanswered ping
    clock.now = 11.5
    ids, lost = w.tick()
    assert [m for m, _ in lost] == ["a"] and "has not answered for 10 s" in lost[0][1]
    clock.now = 12
    assert w.tick() == (["b"], [])  # asked about in turn


def test_an_answer_restarts_the_silence_clock():
    w, clock = watch()
    w.sent("a")
    for t in range(1, 40):
        clock.now = t
        ids, lost = w.tick()
        assert ids == ["a"] and lost == []
        w.pong([])


@given(st.lists(st.sampled_from(["sent", "done", "tick", "pong"]), max_size=60), st.integers(1, 5))
def test_every_request_ends_done_or_lost_at_most_once(ops, most):
    w, clock = watch(most=most)
    ended, n = [], 0
    for op in ops:
        clock.now += 0.3
        if op == "sent":
            w.sent(f"r{n}")
            n += 1
        elif op == "done" and w.in_flight:
            m = next(iter(w.in_flight))
            w.done(m)
            ended.append(m)
        elif op == "tick":
            ids, lost = w.tick()
            assert len(ids) <= most and set(ids) <= set(w.in_flight)
            ended += [m for m, _ in lost]
        elif op == "pong":
            ended += [m for m, _ in w.pong(list(w.in_flight)[:1])]
    assert len(ended) == len(set(ended))
    assert set(ended) | set(w.in_flight) == {f"r{i}" for i in range(n)}
