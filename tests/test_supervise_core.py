"""A queue's held messages, sans-I/O: in order per peer, sent once the peer
is there, dropped and counted after the hold."""

import pytest
from cluster_util import Clock

from ipyparallel_broadcast.controller.queues import HeldForPeers

pytestmark = pytest.mark.pure


def test_held_messages_go_in_order_per_peer_once_the_peer_is_there():
    held, sent, connected = HeldForPeers(hold=5.0, clock=Clock()), [], set()

    def send(msg):
        if msg[0] not in connected:
            return False
        sent.append(msg)
        return True

    for i in range(3):
        held.add(b"a", [b"a", i])
    held.add(b"b", [b"b", 0])
    assert held.blocks(b"a") and held.blocks(b"b") and not held.blocks(b"c")
    assert held.retry(send) == [] and sent == []
    connected.add(b"a")
    assert held.retry(send) == []
    assert sent == [[b"a", 0], [b"a", 1], [b"a", 2]]
    assert not held.blocks(b"a") and held.blocks(b"b") and held


def test_held_messages_are_dropped_after_the_hold_and_counted():
    clock = Clock()
    held = HeldForPeers(hold=5.0, clock=clock)
    held.add(b"gone", [b"gone", 0])
    held.add(b"gone", [b"gone", 1])
    clock.now += 4.9
    assert held.retry(lambda msg: False) == []
    clock.now += 0.2
    assert held.retry(lambda msg: False) == [b"gone"]
    assert held.expired == 2 and not held
