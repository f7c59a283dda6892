"""Calls passed host relay to host relay (``relay.forwarding``), in memory:
the leaf sends to ``host_fanout`` heads, each passes the call on and merges
what comes back; lost hosts fail by name and nothing hangs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from treesim import TreeSim

from ipyparallel_broadcast.relay import forwarding
from ipyparallel_broadcast.wire import protocol as P

pytestmark = pytest.mark.pure

PER_HOST = 2
BULK = dict(chunk=1 << 20, threshold=1 << 30, fanout=1)  # host relays have chunk sockets; no request is big


def walk(trees, depth=1):
    for head, below in trees:
        yield head, len(below), depth
        yield from walk(below, depth + 1)


@given(st.integers(0, 300), st.integers(1, 20))
def test_a_plan_places_every_host_once_and_none_has_more_than_fanout_below(n, fanout):
    trees = forwarding.plan(list(range(n)), fanout)
    placed = list(walk(trees))
    assert sorted(h for h, _, _ in placed) == list(range(n))
    assert len(trees) <= fanout and all(below <= fanout for _, below, _ in placed)
    if n > 1 and fanout > 1:  # a tree's depth grows as the log of the hosts
        assert max(d for _, _, d in placed) <= 2 + n.bit_length() // max(1, (fanout.bit_length() - 1))


def hosted(n_hosts=7, host_fanout=2, per_host=PER_HOST):
    hosts = {f"h{i}": (0, list(range(i * per_host, (i + 1) * per_host))) for i in range(n_hosts)}
    engines = list(range(n_hosts * per_host))
    return TreeSim(0, 2, engines, hosts=hosts, bulk=BULK, host_fanout=host_fanout), engines


def leaf_sent_requests(sim) -> list[str]:
    """The host relays the leaf itself sent a request to."""
    got = []
    for key, inbox in sim.node_inbox.items():
        if isinstance(key, tuple) and key[:1] == ("h",):
            if any(sim.codec.unpack(P.split_idents(f)[1])["header"]["msg_type"] == P.REQUEST for f in inbox):
                got.append(key[1])
    return got


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_to_more_hosts_than_the_fanout_goes_to_two_heads_and_every_engine_answers_once(stream):
    sim, engines = hosted()
    sim.request(engines, stream=stream)
    sim.drain()
    replies, failures, _ = sim.outcomes()  # (asserts each engine counted once)
    assert sorted(replies) == engines and not failures
    assert len(leaf_sent_requests(sim)) == 2
    assert sim.pending_total() == 0
    leaf = sim.nodes[()]
    assert leaf.dropped == 0 and all(n.dropped == 0 for n in sim.nodes.values())


def test_at_a_thousand_hosts_no_relay_sends_more_requests_per_call_than_the_fanout():
    """A leaf over 1,000 host relays (one engine each): the leaf sends a call to
    16 host relays, no host relay passes it to more than 16, every engine answers once."""
    sim, engines = hosted(n_hosts=1000, host_fanout=16, per_host=1)
    sim.request(engines)
    replies, failures, _ = sim.outcomes()
    assert sorted(replies) == engines and not failures and sim.pending_total() == 0
    hosts = {k: n for k, n in sim.requests_sent.items() if k[:1] == ("h",)}
    assert sim.requests_sent[()] == 16 and max(n - 1 for n in hosts.values()) <= 16  # (a host: +1 to its engine)


def test_a_call_to_few_hosts_goes_to_each_from_the_leaf():
    sim, engines = hosted(n_hosts=7, host_fanout=8)
    sim.request(engines)
    replies, failures, _ = sim.outcomes()
    assert sorted(replies) == engines and len(leaf_sent_requests(sim)) == 7


def test_a_host_lost_below_a_head_fails_by_name_and_the_others_are_delivered():
    sim, engines = hosted()
    root = sim.nodes[()]
    sim.hold.update(engines)
    sim.request(engines)
    (p,) = root.pending.values()
    lost = next(h for h, f in p.forwarders.items() if f != h and f in p.forwarders)  # below a host below a head
    label = lost[len(b"ipb-host:") :].decode()
    sim.down_nodes[("h", label)] = "hung"
    mine = set(sim.nodes[("h", label)].engines)
    for eid in engines:
        sim.release(eid)
    assert sim.pending_total() > 0  # its forwarder waits for it
    sim.wait(root.node_timeout + 1)
    replies, failures, _ = sim.outcomes()
    assert set(failures) == mine and sorted(replies) == sorted(set(engines) - mine)
    assert all(f"Host relay {label}" in failures[e][2] for e in mine)
    assert not any(n.pending for k, n in sim.nodes.items() if k != ("h", label))
    # its forwarder passes that life of it no more calls; a new one (same chunk socket) is passed them again
    sim.client_inbox.clear()
    sim.request(engines)
    replies, failures, _ = sim.outcomes()
    assert set(failures) == mine and sorted(replies) == sorted(set(engines) - mine)
    sim.restart(("h", label))
    sim.wait(1)  # (its leaf hears its new life in a pong)
    sim.client_inbox.clear()
    sim.request(engines)
    replies, failures, _ = sim.outcomes()
    assert sorted(replies) == engines and not failures


def test_a_lost_head_takes_the_outcomes_of_the_hosts_below_it_for_that_call_and_nothing_hangs():
    sim, engines = hosted()
    root = sim.nodes[()]
    sim.hold.update(engines)
    sim.request(engines)
    (p,) = root.pending.values()
    head = next(f for f in p.forwarders.values() if f not in p.forwarders)
    below = {h for h in p.forwarders if p.owner_of(h) == head} | {head}
    labels = {h[len(b"ipb-host:") :].decode() for h in below}
    sim.down_nodes[("h", head[len(b"ipb-host:") :].decode())] = "hung"
    for eid in engines:
        sim.release(eid)
    sim.wait(root.node_timeout + 1)
    replies, failures, _ = sim.outcomes()
    subtree = {e for label in labels for e in sim.nodes[("h", label)].engines}
    assert set(failures) == subtree and sorted(replies) == sorted(set(engines) - subtree)
    assert root.pending == {}
    head_label = head[len(b"ipb-host:") :].decode()
    for label in labels:  # each named: the head, and the host it was passing the call to
        for eid in sim.nodes[("h", label)].engines:
            assert f"Host relay {head_label} has not answered" in failures[eid][2]
            assert (label == head_label) != (f"passing the call to host relay {label}," in failures[eid][2])


def test_a_host_that_cannot_be_reached_from_the_host_passing_it_the_call_fails_by_name_and_then_at_once():
    """No receipt within the node timeout: what the host owes fails, naming
    both; the next calls to it from there fail at once, not after a wait.
    (Its engines behind it fail with it: it passes them nothing either.)"""
    sim, engines = hosted()
    root = sim.nodes[()]
    sim.request(engines)
    plan = forwarding.plan([k for k in root.children.bulk], root.forwarding.fanout)
    walled = plan[-1][1][0][0]  # a host passed the call by a head (the leaf reaches it still)
    label = walled[len(b"ipb-host:") :].decode()
    sim.walled.add(("h", label))
    sim.client_inbox.clear()
    sim.request(engines)
    mine = set(sim.nodes[("h", label)].engines)
    sim.wait(root.node_timeout + 1)
    replies, failures, _ = sim.outcomes()
    assert mine <= set(failures) and set(replies) | set(failures) == set(engines)
    assert all(f"Host relay {label} could not be reached from host" in failures[e][2] for e in mine)
    assert sim.pending_total() == 0
    sim.client_inbox.clear()
    sim.request(engines)  # failed at once now: no wait
    replies, failures, _ = sim.outcomes()
    assert mine <= set(failures) and "cannot reach" in failures[min(mine)][2]
    assert sim.pending_total() == 0


def nested(levels):
    entry = ["h0", "tcp://h0:1", [0], [], None]
    for i in range(1, levels):
        entry = [f"h{i}", f"tcp://h{i}:1", [i], [entry], None]
    return [entry]


deep = nested(forwarding.MAX_DEPTH + 3)


@pytest.mark.parametrize(
    "bad",
    [
        "not a list",
        [["h9", "ipc://nowhere", [1], [], None]],  # not a chunk socket
        [["h9", "tcp://h9:1", ["one"], [], None]],
        [["h9", "tcp://h9:1", [1], None]],
        [["h9", "tcp://h9:1", [1], [], 7]],
        deep,  # nested past MAX_DEPTH
    ],
)
def test_a_malformed_forward_list_is_dropped_and_counted(bad):
    sim, engines = hosted()
    relay = sim.nodes[("h", "h0")]
    content = dict(P.request_content("m1", [0], P.COALESCE), req="r1", forward=bad)
    inner = sim.session.serialize(sim.session.msg("apply_request", content={}, metadata={}))[1:]
    assert relay.on_up(sim.codec.pack(P.REQUEST, content, inner)) == []
    assert relay.dropped == 1 and relay.pending == {}


def test_outcomes_passed_back_by_a_peer_not_owed_are_dropped():
    sim, engines = hosted()
    relay = sim.nodes[("h", "h0")]
    bundle = sim.codec.pack(P.BUNDLE, {})  # (for no request it holds)
    assert relay.on_chunk([b"ipb-host:h5"] + bundle) == []
    assert relay.on_chunk([b"not-a-host"] + bundle) == []
    assert relay.dropped == 2
