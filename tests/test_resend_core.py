"""Calls sent again after a restart, without sockets (issue 73): the replies an
engine keeps (``engine.kept``), what the client keeps to send a call again
(``client.copies``), the root watch that tells a lost call from one sent again,
and a node's hold on peers not connected in its first seconds (``relay.startup``)."""

import pytest
from cluster_util import Clock
from hypothesis import given
from hypothesis import strategies as st

from ipyparallel_broadcast.client.copies import CallCopies
from ipyparallel_broadcast.client.replies import LOST, RootWatch
from ipyparallel_broadcast.engine.kept import KeptReplies
from ipyparallel_broadcast.relay.startup import StartupHold
from ipyparallel_broadcast.wire.protocol import OWED_KEY, SEQ_KEY

pytestmark = pytest.mark.pure


def request(seq, owed, client="c1"):
    return dict(session=client), {SEQ_KEY: seq, OWED_KEY: owed}


def reply(nbytes=0):
    return [b"sig", b"{}", b"{}", b"{}", b"{}"] + ([b"x" * nbytes] if nbytes else [])


def test_a_copy_is_answered_with_the_kept_reply_and_never_counted_new():
    kept = KeptReplies()
    header, md = request(0, 0)
    assert kept.arrived("a", header, md)
    assert kept.keep("a", header, md, reply(10))
    assert not kept.arrived("a", header, md)  # a copy
    assert kept.again("a", "c1") == reply(10)
    assert kept.again("a", "root") is None  # another sender's request of that msg_id is its own
    assert kept.resent == 1 and kept.nbytes == 10


def test_replies_below_the_lowest_call_owed_are_let_go_per_client():
    kept = KeptReplies()
    for seq in range(3):
        header, md = request(seq, 0)
        kept.arrived(f"c1-{seq}", header, md)
        kept.keep(f"c1-{seq}", header, md, reply(1))
    other, md = request(0, 0, client="c2")
    kept.arrived("c2-0", other, md)
    kept.keep("c2-0", other, md, reply(1))
    header, md = request(3, 2)  # the client has what it asked before call 2
    kept.arrived("c1-3", header, md)
    assert sorted(kept.replies) == [("c1", "c1-2"), ("c2", "c2-0")]
    assert kept.nbytes == 2 and kept.let_go == 0
    assert kept.again("c1-0", "c1") is None
    assert "not run twice" in kept.missing("c1-0", "c1")


def test_the_bounds_let_the_oldest_go_and_a_reply_too_big_is_not_kept():
    kept = KeptReplies(most=2, most_bytes=100)
    for seq in range(3):
        header, md = request(seq, 0)
        kept.keep(f"m{seq}", header, md, reply(10))
    assert list(kept.replies) == [("c1", "m1"), ("c1", "m2")] and kept.let_go == 1
    header, md = request(3, 0)
    assert not kept.keep("big", header, md, reply(101))
    assert not kept.keep("stock", dict(session="s"), {}, reply())  # no number: not our client's
    assert kept.nbytes == 20


@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 40)), max_size=80))
def test_what_is_kept_stays_within_its_bounds_and_its_byte_count_is_exact(calls):
    kept = KeptReplies(most=8, most_bytes=64)
    for i, (owed, size) in enumerate(calls):
        header, md = request(i, min(owed, i))
        if kept.arrived(f"m{i}", header, md):
            kept.keep(f"m{i}", header, md, reply(size))
        assert len(kept.replies) <= 8 and kept.nbytes <= 64
        assert kept.nbytes == sum(k[3] for k in kept.replies.values())
        assert sum(len(s) for s in kept.by_client.values()) == len(kept.replies)


def test_a_call_goes_again_a_bounded_number_of_times_and_owes_its_number_until_done():
    copies = CallCopies(tries=2)
    assert copies.number("a") == (0, 0)
    assert copies.number("b") == (1, 0)
    assert copies.again("a") is None  # numbered, not yet sent
    copies.keep("a", dict(targets=[0]), [b"f"], True)
    assert copies.again("a").tries == 1
    assert copies.again("a").tries == 2
    assert copies.again("a") is None
    copies.done("a")
    assert copies.number("c") == (2, 1)  # "b" is the lowest still owed
    assert copies.again("zzz") is None


def test_a_pong_to_a_ping_sent_before_a_call_went_again_does_not_lose_it():
    clock = Clock()
    w = RootWatch(interval=0.5, timeout=10, clock=clock)
    w.sent("a")
    clock.now = 1
    assert w.tick()[0] == ["a"]  # ping 1
    clock.now = 1.2
    w.sent("a")  # sent again, after the ping
    assert w.pong(["a"]) == []  # the root had not had it yet
    clock.now = 2
    assert w.tick()[0] == ["a"]
    assert w.pong(["a"]) == [("a", LOST)]
    assert w.lose_all("why") == []


def test_the_controller_restarting_loses_every_call_in_flight_and_done_forgets_its_copy():
    w = RootWatch()
    w.copies.number("a")
    w.sent("a")
    w.sent("b")
    assert w.lose_all("restarted") == [("a", "restarted"), ("b", "restarted")]
    assert w.in_flight == {} and "a" in w.copies.owed
    w.done("a")
    assert "a" not in w.copies.owed


def test_a_peer_not_connected_yet_has_its_messages_held_in_order_until_the_grace_ends():
    clock = Clock()
    hold = StartupHold(clock, grace=10)
    assert hold.due is None
    assert not hold.waiting([b"leaf0", b"ping"])  # nothing held: sent as usual
    assert hold.hold([b"leaf0", b"r1"])
    assert hold.waiting([b"leaf0", b"ping"])  # behind the request it asks about
    assert not hold.waiting([b"leaf1", b"r2"])
    due = hold.due
    clock.now = 0.05
    assert hold.due == due == 0.1  # fixed when held: traffic meanwhile does not push it back
    assert hold.take() == [[b"leaf0", b"r1"], [b"leaf0", b"ping"]]
    assert hold.held == {} and hold.retried == 2 and hold.due is None
    clock.now = 10
    assert not hold.hold([b"leaf0", b"r3"])  # the grace is over: the peer is lost
