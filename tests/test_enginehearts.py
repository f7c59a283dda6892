"""A host relay's watch over its engines' hearts, without sockets
(``relay.enginehearts``): each hub ping is answered for the host and passed
on; an engine's first answer is told once; a silent engine whose process is
gone is given up at once, one that lives is kept as paused until the limit,
and one whose process the relay cannot see is given up when it misses."""

import pytest

from ipyparallel_broadcast.relay.enginehearts import ENGINE_PING, HUB_PONG, MISSES, EngineHearts
from ipyparallel_broadcast.wire import protocol as P

pytestmark = pytest.mark.pure


class Clock:
    now = 0.0

    def __call__(self):
        return self.now


def rounds(hearts, n, answering=(), alive=lambda uuid: None, clock=None, period=1.0):
    """``n`` pings; the engines in ``answering`` answer each. What was given up."""
    gone = []
    for _ in range(n):
        if clock is not None:
            clock.now += period
        hearts.hub_ping([b"1.0"])
        for uuid in answering:
            hearts.pong([uuid.encode(), b"1.0"])
        gone += hearts.silent(alive)
    return gone


def test_a_ping_is_answered_for_the_host_and_passed_on():
    hearts = EngineHearts()
    sends = hearts.hub_ping([b"12.5"])
    assert [(s.socket, s.frames) for s in sends] == [(HUB_PONG, [b"12.5"]), (ENGINE_PING, [b"12.5"])]


def test_a_first_answer_is_told_once():
    hearts = EngineHearts()
    hearts.hub_ping([b"1"])
    hearts.pong([b"a", b"1"])
    hearts.pong([b"b", b"1"])
    hearts.pong([b"a", b"1"])
    assert hearts.take_first() == ["a", "b"] and hearts.take_first() == []


def test_an_engine_that_cannot_be_seen_is_given_up_when_it_misses():
    hearts = EngineHearts()
    assert rounds(hearts, 3, answering=["a", "b"]) == []
    assert rounds(hearts, MISSES, answering=["a"]) == []  # b may miss this many
    assert rounds(hearts, 1, answering=["a"]) == ["b"]
    assert rounds(hearts, 5, answering=["a"]) == []  # once only


def test_a_dead_process_is_given_up_at_once_and_a_paused_one_is_kept_until_the_limit():
    clock = Clock()
    hearts = EngineHearts(pause_limit=30.0, clock=clock)
    running = {"dead": False, "paused": True}
    alive = running.get
    rounds(hearts, 2, answering=["dead", "paused", "ok"], alive=alive, clock=clock)
    gone = rounds(hearts, MISSES + 1, answering=["ok"], alive=alive, clock=clock)
    assert gone == ["dead"]
    assert hearts.stats() == dict(hearts=2, paused=1, pings=5)
    assert rounds(hearts, 25, answering=["ok"], alive=alive, clock=clock) == []  # paused: 26 s so far
    hearts.pong([b"paused", b"1.0"])  # it resumes: no longer paused
    assert hearts.stats()["paused"] == 0
    assert rounds(hearts, 40, answering=["ok"], alive=alive, clock=clock) == ["paused"]  # paused again, too long


def test_a_pong_without_its_ping_is_refused():
    with pytest.raises(P.ProtocolError):
        EngineHearts().pong([b"a"])
