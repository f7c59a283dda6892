"""Host relays in the pure core: the whole tree in memory, hosts included.

A host relay hangs under one leaf and serves the engines that joined it,
whatever their ids; the tree routes to them by what was announced, and one
request crosses each host's link per call.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ipyparallel.serialize import serialize_object
from treesim import TreeSim, frames_bytes, stock_request

from ipyparallel_broadcast.relay.routes import Routes
from ipyparallel_broadcast.wire import bundles as B
from ipyparallel_broadcast.wire import protocol as P
from ipyparallel_broadcast.wire.reduction import Reduction, engine_value
from ipyparallel_broadcast.wire.topology import TreeShape

pytestmark = pytest.mark.pure

ENGINES = list(range(12))
# ids 0..5 on two hosts whose leaves the modulo rule does not always pick; 6.. direct
HOSTS = {"h1": (0, [0, 1, 2]), "h2": (1, [3, 4, 5])}


def hosted(depth=1, fanout=2, hosts=HOSTS):
    return TreeSim(depth, fanout, ENGINES, hosts=hosts)


def requests_at(sim, key):
    return [
        f
        for f in sim.node_inbox[key]
        if sim.codec.unpack(P.split_idents(f)[1], content=False)["header"]["msg_type"] == P.REQUEST
    ]


@pytest.mark.parametrize("depth", [0, 1, 2])
def test_every_host_relay_learned_its_route_end_to_end(depth):
    sim = hosted(depth=depth)
    assert sorted(sim.joined) == [(("h", "h1"), e) for e in (0, 1, 2)] + [(("h", "h2"), e) for e in (3, 4, 5)]
    root = sim.nodes[()]
    assert (root.routes.via if depth == 0 else root.routes.learned).keys() >= {0, 1, 2, 3, 4, 5}


@pytest.mark.parametrize("depth", [0, 1, 2])
@pytest.mark.parametrize("stream", [False, True])
def test_one_request_per_host_and_every_target_answered_once(depth, stream):
    sim = hosted(depth)
    sim.request(ENGINES, stream=stream)
    replies, failures, n_messages = sim.outcomes()
    assert sorted(replies) == ENGINES and not failures
    assert len(requests_at(sim, ("h", "h1"))) == len(requests_at(sim, ("h", "h2"))) == 1
    assert all(len(sim.engine_inbox[e]) == 1 for e in ENGINES)
    assert n_messages == (len(ENGINES) if stream else 1)
    assert sim.pending_total() == 0


def test_scatter_sends_each_host_only_its_engines_shares():
    sim = hosted()
    each = [[f"part-{e}".encode()] for e in ENGINES]
    sim.request(ENGINES, each=each)
    (h1,) = requests_at(sim, ("h", "h1"))
    shares = {f for f in frames_bytes(h1) if f.startswith(b"part-")}
    assert shares == {b"part-0", b"part-1", b"part-2"}
    for e in ENGINES:
        assert P.as_bytes(sim.engine_inbox[e][0][-1]) == f"part-{e}".encode()


def test_reduce_combines_on_each_host():
    sim = hosted()
    sim.answer_with = lambda eid, request: ({"status": "ok"}, serialize_object(engine_value(lambda: eid)))
    sim.request(ENGINES, reduce="sum")
    (frames,) = sim.client_inbox
    state, value, raised, failed = B.reduced_parts(sim.codec.unpack(P.split_idents(frames)[1]))
    r = Reduction("sum")
    r.add_partial(state, value)
    assert r.result() == sum(ENGINES) and not raised and not failed
    for key in (("h", "h1"), ("h", "h2")):  # each host sent one combined value up
        assert sim.nodes[key].pending == {}


def test_a_dead_host_relay_fails_its_engines_by_name_and_comes_back():
    sim = hosted()
    sim.hold.update({0, 1, 2})
    sim.request(ENGINES)
    sim.down_nodes[("h", "h1")] = "hung"
    sim.wait(sim.nodes[(0,)].node_timeout + 1)
    replies, failures, _ = sim.outcomes()
    assert sorted(failures) == [0, 1, 2] and sorted(replies) == list(range(3, 12))
    assert all("Host relay h1 has not answered" in f[2] for f in failures.values())
    assert not any(n.pending for k, n in sim.nodes.items() if k != ("h", "h1"))
    sim.hold.clear()
    sim.restart(("h", "h1"))  # its engines join the new relay
    sim.client_inbox.clear()
    sim.request([0, 1, 2, 6])
    replies, failures, _ = sim.outcomes()
    assert sorted(replies) == [0, 1, 2, 6] and not failures


def test_an_unreachable_host_relay_fails_at_once():
    sim = hosted()
    sim.down_nodes[("h", "h2")] = "dead"
    sim.request(ENGINES)
    replies, failures, n = sim.outcomes()
    assert sorted(failures) == [3, 4, 5] and n == 1
    assert all("Host relay h2 is down" in f[2] for f in failures.values())


@pytest.mark.parametrize("stream", [False, True])
def test_an_engine_that_dies_behind_a_host_relay_fails_there_once(stream):
    sim = hosted()
    sim.hold.add(4)
    sim.request(ENGINES, stream=stream)
    sim.kill(4)
    replies, failures, _ = sim.outcomes()  # outcomes() asserts each engine counted once
    assert sorted(failures) == [4] and "died" in failures[4][2]
    assert sorted(replies) == [e for e in ENGINES if e != 4]
    assert 4 not in sim.nodes[(1,)].routes.via and 4 not in sim.nodes[("h", "h2")].engines
    assert sim.pending_total() == 0


def test_a_restarted_root_learns_the_routes_again_at_its_first_ping():
    sim = hosted(depth=2)
    sim.restart(())
    assert not sim.nodes[()].routes.learned
    sim.tick(sim.nodes[()].ping_interval)  # new boot in the ping: children announce again
    sim.request(ENGINES)
    replies, failures, _ = sim.outcomes()
    assert sorted(replies) == ENGINES and not failures


def test_a_request_on_its_way_as_a_hosted_engine_died_fails_it_as_dead():
    """The root still routes engine 4 (the leaf's news of its death is on the
    way) when a request goes out: the leaf fails it as dead, by name, not as
    sent to the wrong subtree (the chaos soak saw the latter)."""
    sim = hosted()
    sim.kill(4)
    sim.nodes[()].routes.learn(1, [4], [])  # the root has not heard yet
    sim.request(ENGINES)
    replies, failures, _ = sim.outcomes()
    assert sorted(failures) == [4] and "Engine 4 died" in failures[4][2]
    assert sorted(replies) == [e for e in ENGINES if e != 4]


def test_a_request_for_a_hosted_engine_the_root_heard_died_fails_there():
    """The root has heard engine 4 (behind h2, under leaf 1 by announcement,
    leaf 0 by the modulo rule) is gone: a request the client sent before it
    heard fails 4 as dead at the root, not at the modulo leaf as misrouted."""
    sim = hosted()
    sim.kill(4)
    assert 4 in sim.nodes[()].routes.departed
    sim.request(ENGINES)
    replies, failures, _ = sim.outcomes()
    assert sorted(failures) == [4] and "Engine 4 died" in failures[4][2]
    assert sorted(replies) == [e for e in ENGINES if e != 4]


@pytest.mark.parametrize("stream", [False, True])
def test_a_restarted_leaf_is_found_again_by_its_host_relays(stream):
    """A leaf that restarted does not know its host relays, so it pings none:
    each relay, its leaf silent for three pings, says hello and lists its
    engines again, and they are reachable once more (issue 32's soak found
    hosts cut off for good after a leaf restart)."""
    sim = hosted(depth=1)
    sim.restart((0,))
    leaf = sim.nodes[(0,)]
    assert not leaf.children.idents  # h1 hangs under leaf 0; the new process has not heard of it
    relay = sim.nodes[("h", "h1")]
    assert relay.next_deadline() <= relay.heartbeats.parent_heard + relay.heartbeats.parent_silence
    sim.wait(relay.heartbeats.parent_silence + leaf.ping_interval)
    sim.client_inbox.clear()
    sim.request(ENGINES, stream=stream)
    replies, failures, _ = sim.outcomes()
    assert sorted(replies) == ENGINES and not failures


def test_a_silent_host_relay_with_no_engines_left_is_forgotten():
    sim = hosted()
    sim.down_nodes[("h", "h1")] = "hung"
    for eid in (0, 1, 2):
        sim.kill(eid)
    leaf = sim.nodes[(0,)]
    sim.wait(leaf.node_timeout + 1)
    assert not leaf.children and leaf.next_deadline() is None


def test_stats_survey_reaches_the_host_relays():
    sim = hosted(depth=2)
    root = sim.nodes[()]
    sim._run(root, root.on_up([b"client"] + sim.codec.pack(P.STATS, dict(msg_id="s"))), ())
    (frames,) = sim.client_inbox
    nodes = {n["node"]: n for n in sim.codec.unpack(P.split_idents(frames)[1])["content"]["nodes"]}
    assert nodes["host h1"]["engines"] == 3 and nodes["host h1"]["host"] == "h1"
    assert any(n.get("hosts") == ["h1"] for n in nodes.values())


@pytest.mark.parametrize("coalescing", [True, False])
def test_stock_clients_are_served_through_host_relays(coalescing):
    sim = hosted(depth=0)
    stock_request(sim, ENGINES, coalescing)
    assert len(sim.client_inbox) == (1 if coalescing else len(ENGINES))
    for frames in sim.client_inbox:
        msg = sim.codec.unpack(P.split_idents(frames)[1])
        assert msg["content"]["status"] == "ok"


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 3), st.integers(2, 3), st.data())
def test_any_placement_of_engines_on_hosts_routes(depth, fanout, data):
    """Engines on hosts under any leaf, whatever their ids (an MPI rank, say):
    every target answered once, one request per host per call."""
    n_leaves = fanout**depth
    placement = data.draw(
        st.lists(st.sampled_from(["direct", "a", "b", "c"]), min_size=len(ENGINES), max_size=len(ENGINES))
    )
    leaves = {h: data.draw(st.integers(0, n_leaves - 1)) for h in "abc"}
    hosts = {h: (leaves[h], [e for e, p in zip(ENGINES, placement) if p == h]) for h in "abc" if h in placement}
    sim = TreeSim(depth, fanout, ENGINES, hosts=hosts)
    targets = data.draw(st.lists(st.sampled_from(ENGINES), unique=True))
    stream = data.draw(st.booleans())
    sim.request(targets, stream=stream)
    replies, failures, _ = sim.outcomes()
    assert sorted(replies) == sorted(targets) and not failures
    for h, (_, eids) in hosts.items():
        assert len(requests_at(sim, ("h", h))) == (1 if set(eids) & set(targets) else 0)
    assert sim.pending_total() == 0


@pytest.mark.parametrize("stream", [False, True])
def test_engines_of_a_cut_off_host_fail_as_the_hub_drops_them_naming_the_host(stream):
    """A host whose link is down: its relay falls silent, then the hub drops
    its engines (heartbeats); they fail at once, well before ``node_timeout``."""
    sim = hosted()
    sim.hold.update({0, 1, 2})
    sim.request(ENGINES, stream=stream)
    sim.down_nodes[("h", "h1")] = "hung"
    sim.wait(3)  # under node_timeout: the leaf has not given up on the relay
    assert len(sim.client_inbox) == (9 if stream else 0)  # nothing failed yet
    for eid in (0, 1, 2):
        sim.kill(eid)
    replies, failures, _ = sim.outcomes()
    assert sorted(failures) == [0, 1, 2] and sorted(replies) == list(range(3, 12))
    assert all("on host h1 died" in f[2] for f in failures.values())
    assert not any(n.pending for k, n in sim.nodes.items() if k != ("h", "h1"))


def test_pings_and_pongs_take_the_pulse_link_once_a_host_relay_knows_it():
    from ipyparallel_broadcast.relay.events import DOWN, PULSE, UP

    sim = hosted(depth=0)
    leaf, relay = sim.nodes[()], sim.nodes[("h", "h1")]
    leaf.heartbeats.pulse_port = 40001
    ident = leaf.children.idents[next(k for k in leaf.children if isinstance(k, bytes) and b"h1" in k)]
    sim.now += leaf.ping_interval
    pings = [s for s in leaf.on_tick() if s.frames[0] == ident]
    assert [s.socket for s in pings] == [DOWN]  # not pulsing yet: the data link tells the port
    answer = relay.on_up(pings[0].frames[1:])  # a pong each way: on the pulse link, it says who it is
    assert relay.heartbeats.parent_pulse == 40001 and sorted(s.socket for s in answer) == [PULSE, UP]
    pulse = next(s for s in answer if s.socket == PULSE)
    assert leaf.on_pulse([ident] + pulse.frames) == [] and leaf.children.pulsing == {ident}
    pong = relay.on_parent_pulse(leaf.heartbeats._ping(sim.now)[0].frames[1:])  # pings that come that way
    assert [s.socket for s in pong] == [PULSE]  # are answered that way
    late = next(s for s in answer if s.socket == UP)  # the data link's answer, after the pulse's
    assert leaf.on_down([ident] + late.frames) == [] and leaf.children.pulsing == {ident}  # it was asked for
    sim.now += leaf.ping_interval
    pings = [s for s in leaf.on_tick() if s.frames[0] == ident]
    assert [s.socket for s in pings] == [PULSE]  # that link alone from now on
    dropped = leaf.dropped
    leaf.on_pulse([ident] + sim.codec.pack(P.BUNDLE, {}))  # only pongs come that way
    assert leaf.dropped == dropped + 1
    # the relay stops hearing the pulse link: its pings stop, and it says hello on the data link, unasked
    sim.now += relay.heartbeats.parent_silence + 0.01
    hello = [s for s in relay.on_tick() if s.socket == UP]
    assert hello
    leaf.on_down([ident] + hello[0].frames)
    assert not leaf.children.pulsing  # pinged on the data link again, which tells it the port anew
    sim.now += leaf.ping_interval
    pings = [s for s in leaf.on_tick() if s.frames[0] == ident]
    assert [s.socket for s in pings] == [DOWN]
    again = relay.on_up(pings[0].frames[1:])
    assert sorted(s.socket for s in again) == [PULSE, UP]  # it says who it is on the pulse link again
    leaf.on_pulse([ident] + next(s for s in again if s.socket == PULSE).frames)
    assert leaf.children.pulsing == {ident}


def test_a_host_relay_back_from_a_cut_lists_engines_the_hub_dropped_and_gets_no_route_for_them():
    """Cut off, a host relay keeps its engines while the hub drops them; when
    its link comes back it lists them again (it says hello when its leaf is
    silent). The leaf routes none of them and tells the relay, which drops
    them; once the relay is gone, the leaf forgets it (the cut-off host test
    on the bed found it kept for good)."""
    sim = hosted()
    relay_path = ("h", "h1")
    relay, leaf = sim.nodes[relay_path], sim.nodes[(0,)]
    sim.down_nodes[relay_path] = "hung"
    for eid in (0, 1, 2):
        sim.kill(eid)
    sim.wait(leaf.node_timeout + 1)
    assert not leaf.children.idents  # the silent relay, with no engine left, is forgotten
    del sim.down_nodes[relay_path]  # the link is back
    sim.wait(relay.heartbeats.parent_silence + leaf.ping_interval)
    assert not {0, 1, 2} & set(leaf.routes.via)
    assert not {0, 1, 2} & set(relay.engines)  # told, the relay dropped them
    sim.down_nodes[relay_path] = "dead"  # and, its engines gone, it exits
    sim.wait(2 * leaf.ping_interval)
    assert not leaf.children.idents
    sim.client_inbox.clear()
    sim.request(list(range(3, 12)))
    replies, failures, _ = sim.outcomes()
    assert sorted(replies) == list(range(3, 12)) and not failures


@given(st.lists(st.tuples(st.sampled_from([b"h1", b"h2", b"h3"]), st.sets(st.integers(0, 12))), max_size=12))
def test_a_leaf_keeps_each_host_relays_engines_as_its_routes_say(lists):
    """The leaf's index by host (``Routes.behind``) mirrors ``via`` whatever the
    host relays list, and an engine that moves host leaves the old one's list."""
    routes = Routes(TreeShape(1, 2), (0,), True)
    for host, eids in lists:
        added, gone = routes.host_engines(host, eids)
        assert set(gone).isdisjoint(eids) and set(added) <= eids
        by_host = {}
        for eid, h in routes.via.items():
            by_host.setdefault(h, set()).add(eid)
        assert {h: e for h, e in routes.behind.items() if e} == by_host
        assert routes.routes_to(host) == bool(eids)
