"""A relay node dies, restarts or hangs (the pure core, no sockets): what
waits on it fails at once with an error naming it, the rest of the request
is delivered, no state is left, and later requests go through."""

import pytest
from treesim import TreeSim

from ipyparallel_broadcast.wire import protocol as P

pytestmark = pytest.mark.pure

ENGINES = list(range(8))  # depth 2, fan-out 2: leaf 0.1 serves engines 1 and 5, node 1: 2, 3, 6, 7


def held_request(sim, stream):
    """A request to every engine, all of them still busy."""
    sim.hold = set(ENGINES)
    sim.request(ENGINES, stream=stream)


def release_all(sim):
    for eid in ENGINES:
        sim.release(eid)


def outcomes(sim):
    """Engines that replied, and each failed engine's message (bundles read once)."""
    replies, failures, _ = sim.outcomes()
    return set(replies), {eid: f[2] for eid, f in failures.items()}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path, lost", [((0, 1), {1, 5}), ((1,), {2, 3, 6, 7})])
def test_a_dead_node_fails_what_waits_on_it_and_the_rest_arrives(stream, path, lost):
    sim = TreeSim(2, 2, ENGINES)
    held_request(sim, stream)
    sim.down_nodes[path] = "dead"
    release_all(sim)
    sim.tick(0.5)  # the parent's next ping finds the link closed
    replies, failures, _ = sim.outcomes()
    assert set(replies) == set(ENGINES) - lost
    assert set(failures) == lost
    name = ".".join(map(str, path))
    assert all(f"Relay node {name} is down" in failures[e][2] for e in lost)
    assert all(failures[e][3] == P.UNREACHABLE for e in lost)
    assert sim.pending_total() == 0 or path == (1,)  # a dead node's own table died with it
    assert all(not n.pending for p, n in sim.nodes.items() if p not in sim.down_nodes)


@pytest.mark.parametrize("stream", [False, True])
def test_a_restarted_node_is_seen_at_its_hello_and_serves_again(stream):
    sim = TreeSim(2, 2, ENGINES)
    for path in [(0,), (0, 1)]:  # introductions: parents learn each child's boot
        sim.restart(path)
    held_request(sim, stream)
    sim.down_nodes[(0, 1)] = "hung"  # its process is gone; replies to it are lost
    for eid in ENGINES:
        if eid not in (1, 5):
            sim.release(eid)
    sim.restart((0, 1))  # back before any ping: the new boot gives it away
    replied, messages = outcomes(sim)
    assert set(messages) == {1, 5}
    assert all("Relay node 0.1 restarted" in m for m in messages.values())
    assert len(replied) == 6
    assert sim.pending_total() == 0
    sim.client_inbox.clear()
    sim.hold.clear()
    sim.request(ENGINES, stream=stream)
    replies, failures, _ = sim.outcomes()
    assert set(replies) == set(ENGINES) and not failures


@pytest.mark.parametrize("stream", [False, True])
def test_a_node_restarted_before_its_parent_knew_its_boot_fails_what_it_held_at_its_hello(stream):
    sim = TreeSim(2, 2, ENGINES)  # no introductions: as after node 0 restarted, no boot of 0.1 is known
    held_request(sim, stream)
    sim.down_nodes[(0, 1)] = "hung"
    for eid in set(ENGINES) - {1, 5}:
        sim.release(eid)
    sim.restart((0, 1))  # its hello is node 0's first word from it: asked at once, it holds nothing
    replied, messages = outcomes(sim)
    assert set(messages) == {1, 5} and len(replied) == 6
    assert all("Relay node 0.1 lost the request (it restarted or dropped it)" in m for m in messages.values())
    assert sim.pending_total() == 0


def test_a_request_a_live_node_never_got_fails_at_its_second_ping():
    sim = TreeSim(1, 2, ENGINES)
    for path in [(0,), (1,)]:  # introductions: the root knows both boots
        sim.restart(path)
    sim.down_nodes[(1,)] = "hung"  # the request to node 1 is lost on the way
    held_request(sim, stream=False)
    del sim.down_nodes[(1,)]
    for eid in (0, 2, 4, 6):
        sim.release(eid)
    sim.tick(0.5)  # owed since this ping only: not asked yet
    assert sim.client_inbox == []
    sim.tick(0.5)
    replied, messages = outcomes(sim)
    assert set(messages) == {1, 3, 5, 7} and replied == {0, 2, 4, 6}
    assert all("Relay node 1 lost the request" in m for m in messages.values())
    assert sim.pending_total() == 0


def test_a_silent_node_is_lost_after_node_timeout_and_only_then():
    sim = TreeSim(1, 2, ENGINES)
    timeout = sim.nodes[()].node_timeout
    held_request(sim, stream=False)
    sim.down_nodes[(1,)] = "hung"
    for eid in (0, 2, 4, 6):
        sim.release(eid)
    steps = int(timeout / 0.5)
    for _ in range(steps - 1):
        sim.tick(0.5)
    assert sim.client_inbox == []  # silent, not yet given up on
    for _ in range(3):
        sim.tick(0.5)
    replied, messages = outcomes(sim)
    assert set(messages) == {1, 3, 5, 7}
    assert all(f"has not answered for {timeout:g} s" in m for m in messages.values())
    assert replied == {0, 2, 4, 6}
    assert not sim.nodes[()].pending


def test_a_live_but_busy_node_is_never_given_up_on():
    sim = TreeSim(2, 2, ENGINES)
    held_request(sim, stream=False)
    for _ in range(100):  # 50 s of pings, pongs keep every link alive
        sim.tick(0.5)
    assert sim.client_inbox == []
    release_all(sim)
    replies, failures, count = sim.outcomes()
    assert set(replies) == set(ENGINES) and not failures and count == 1


def test_pings_need_valid_signatures():
    sim = TreeSim(1, 2, ENGINES)
    leaf = sim.nodes[(0,)]
    forged = TreeSim(1, 2, ENGINES, key=b"wrong").codec.pack(P.PING, {})
    assert leaf.on_up(forged) == [] and leaf.dropped == 1
    root = sim.nodes[()]
    pong = sim.codec.pack(P.PONG, {"node": "0", "boot": 7})  # boot must be a string
    assert root.on_down([b"ipb-node:0"] + pong) == [] and root.dropped == 1
    assert [s.socket for s in leaf.on_up(sim.codec.pack(P.PING, {}))] == ["up"]
