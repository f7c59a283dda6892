"""A relay node's parts, each built and tested alone (``relay.deadlines``,
``relay.heartbeat``): what a part is given (a ``NodeContext``, callbacks) is
all it reaches of the node. Pure: no sockets, a clock the test moves."""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from jupyter_client.session import Session

from ipyparallel_broadcast.relay import events as E
from ipyparallel_broadcast.relay.children import Children
from ipyparallel_broadcast.relay.context import NodeContext
from ipyparallel_broadcast.relay.deadlines import Deadlines
from ipyparallel_broadcast.relay.events import DOWN, PULSE, UP, Send
from ipyparallel_broadcast.relay.heartbeat import Heartbeats
from ipyparallel_broadcast.relay.inflight import InFlight, Pending
from ipyparallel_broadcast.wire import protocol as P
from ipyparallel_broadcast.wire.topology import node_identity

pytestmark = pytest.mark.pure


# ------------------------------------------------------------------ deadlines
@given(st.lists(st.one_of(st.none(), st.floats(0, 100)), max_size=8), st.floats(0, 100))
def test_the_registry_gives_the_earliest_deadline_and_fires_what_is_due_in_order(times, now):
    deadlines, fired = Deadlines(), []
    for i, t in enumerate(times):
        deadlines.add(f"t{i}", lambda t=t: t, lambda at, i=i: fired.append((i, at)) or [Send(UP, [i])])
    known = [t for t in times if t is not None]
    assert deadlines.next() == (min(known) if known else None)
    due = [i for i, t in enumerate(times) if t is not None and t <= now]
    assert deadlines.due(now) == [f"t{i}" for i in due]
    assert [s.frames[0] for s in deadlines.fire(now)] == due
    assert fired == [(i, now) for i in due]


def test_a_timer_name_is_taken_once():
    deadlines = Deadlines()
    deadlines.add("pings", lambda: None, lambda now: [])
    with pytest.raises(ValueError, match="pings"):
        deadlines.add("pings", lambda: 1.0, lambda now: [])


def test_a_deadline_is_asked_anew_each_time():
    deadlines, state = Deadlines(), {"at": 5.0}
    deadlines.add("moving", lambda: state["at"], lambda now: state.update(at=None) or [])
    assert deadlines.next() == 5.0
    deadlines.fire(6.0)
    assert deadlines.next() is None and deadlines.fire(7.0) == []


# ----------------------------------------------------------------- heartbeats
class Beating:
    """One ``Heartbeats`` alone: a node at ``path`` with two children (or a
    host relay), its callbacks recorded."""

    def __init__(self, path=(0,), host=None, held=()):
        self.now, self.calls, self.dropped = 0.0, [], []
        self.codec = P.Codec(Session(key=b"k"))
        clock = lambda: self.now  # noqa: E731
        ctx = NodeContext(self.codec, clock, "test node", "boot-1", not path and not host, host, self.drop)
        self.children = Children(path, [] if host else range(2), clock, 0.5, 10.0)
        self.deadlines = Deadlines()
        self.inflight = InFlight(self.codec, "bundles", False, clock, clock)
        self.beats = Heartbeats(
            ctx,
            self.children,
            self.deadlines,
            self.inflight,
            child_lost=lambda key, why: self.calls.append(("lost", key, why)) or [],
            held=lambda: set(held),
            reannounce=lambda: self.calls.append(("reannounce",)) or [Send(UP, ["routes"])],
            parent_restarted=lambda: self.calls.append(("restarted",)) or [],
        )

    def drop(self, why):
        self.dropped.append(why)
        return []

    def ping(self, **content):
        return self.codec.pack(P.PING, content)

    def read(self, send) -> dict:
        """A sent message, as its receiver reads it (a codec of its own: one
        message sent to two children would be a replay to one codec)."""
        return P.Codec(Session(key=b"k")).unpack(P.split_idents(send.frames)[1])

    def kind(self, send):
        return self.read(send)["header"]["msg_type"]

    def waiting(self, key, child, eids):
        """A request ``key`` here that child ``child`` owes engines ``eids``."""
        p = self.inflight.requests[key] = Pending(key, f"msg-{key}", False, [b"client"], [])
        p.state.expect(child, eids)
        p.n = len(eids)

    def pings(self):
        """The next pings, each child's content (read as it would)."""
        self.now = self.children.next_ping
        return {self.children.key_of(s.frames[0]): self.read(s)["content"] for s in self.deadlines.fire(self.now)}


def test_children_are_pinged_when_the_registry_says_and_a_silent_one_is_lost():
    b = Beating()
    assert b.deadlines.due(b.now) == ["pings"]
    sends = b.deadlines.fire(b.now)
    assert sorted(s.frames[0] for s in sends) == [node_identity((0, 0)), node_identity((0, 1))]
    assert {b.kind(s) for s in sends} == {P.PING} and {s.socket for s in sends} == {DOWN}
    assert b.deadlines.next() == 0.5
    b.now = 10.5  # neither child answered
    b.deadlines.fire(b.now)
    assert [c[:2] for c in b.calls] == [("lost", 0), ("lost", 1)]
    assert "has not answered for 10 s" in b.calls[0][2]


def test_a_child_that_comes_back_with_a_new_boot_is_lost_and_a_pong_without_one_is_refused():
    b = Beating()
    assert b.beats.pong(0, dict(boot="a")) == [] and b.calls == []
    b.beats.pong(0, dict(boot="b"))
    assert b.calls == [("lost", 0, "restarted")]
    with pytest.raises(P.ProtocolError, match="boot"):
        b.beats.pong(1, {})


def test_a_parent_that_restarted_hears_the_routes_again_and_its_chains_end():
    b = Beating()
    first = b.beats.parent_ping(dict(boot="p1"))
    assert [b.kind(s) for s in first] == [P.PONG] and b.calls == []
    b.beats.parent_ping(dict(boot="p1"))
    assert b.calls == []
    again = b.beats.parent_ping(dict(boot="p2"))
    assert b.calls == [("reannounce",), ("restarted",)] and again[-1].frames == ["routes"]


def test_a_host_relay_follows_the_pulse_port_and_says_hello_when_its_leaf_is_silent():
    b = Beating(path=(0,), host="h1")
    sends = b.beats.parent_ping(dict(boot="p1", pulse=40001))
    assert b.beats.parent_pulse == 40001 and sorted(s.socket for s in sends) == [PULSE, UP]
    assert b.beats.parent_ping(dict(boot="p1", pulse=70000)) and b.beats.parent_pulse == 40001  # not a port
    silent = b.beats.parent_heard + b.beats.parent_silence
    assert b.deadlines.next() == silent
    b.now = silent
    sends = b.deadlines.fire(b.now)
    assert [b.kind(s) for s in sends[:1]] == [P.PONG] and b.calls == [("reannounce",)]
    assert b.deadlines.next() == b.now + b.beats.parent_silence


def test_a_leaf_under_many_host_relays_pings_them_further_apart_and_tells_them_so():
    """Past ``FULL_RATE_CHILDREN`` host relays a leaf's pings come further
    apart in proportion (as many per second as for 32), never past a quarter
    of ``node_timeout``; each ping says its interval, and a host relay waits
    three of them before it takes its leaf for silent."""
    from ipyparallel_broadcast.relay.children import FULL_RATE_CHILDREN
    from ipyparallel_broadcast.wire.topology import host_ident

    leaf = Beating(path=(0,))  # (two children to begin with)
    for count, interval in ((FULL_RATE_CHILDREN, 0.5), (2 * FULL_RATE_CHILDREN, 1.0), (200, 2.5)):
        for i in range(len(leaf.children.idents), count):
            leaf.children.add_host(host_ident(f"h{i}"))
        pings = leaf.deadlines.fire(leaf.now)
        assert len(pings) == count and {leaf.read(p)["content"]["every"] for p in pings} == {interval}
        assert leaf.deadlines.next() == leaf.now + interval
        leaf.now += interval
    relay = Beating(path=(0,), host="h1")
    assert relay.beats.parent_silence == 1.5
    relay.beats.parent_ping(dict(boot="p1", every=2.5))
    assert relay.beats.parent_silence == 7.5
    relay.beats.parent_ping(dict(boot="p1", every="soon"))  # (not a number: kept)
    relay.beats.parent_ping(dict(boot="p1", every=0.1))  # (never below its own interval)
    assert relay.beats.parent_silence == 1.5


def test_a_client_hears_which_of_its_requests_are_not_held():
    b = Beating(path=(), held=("m1",))
    ping = E.Ping([b"client"], dict(ids=["m1", "m2"]))
    (pong,) = b.beats.client_ping(ping)
    assert pong.frames[0] == b"client" and b.read(pong)["content"]["unknown"] == ["m2"]
    with pytest.raises(P.ProtocolError):
        b.beats.client_ping(E.Ping([b"client"], dict(ids="m1")))


def test_a_child_is_asked_for_the_requests_it_owed_a_ping_ago_and_those_it_does_not_hold_fail():
    b = Beating()
    b.beats.pong(0, dict(boot="a"))
    b.beats.pong(1, dict(boot="b"))
    b.waiting("r1", 0, [3, 7])
    assert all("keys" not in c for c in b.pings().values())  # owed since this ping only
    b.waiting("r2", 0, [5])
    b.waiting("r3", 1, [4])
    asked = b.pings()
    assert asked[0]["keys"] == ["r1"] and "keys" not in asked[1]
    assert b.beats.pong(0, dict(boot="a", unknown=[])) == []  # it holds r1
    assert b.pings()[0]["keys"] == ["r1", "r2"]
    ups = b.beats.pong(0, dict(boot="a", unknown=["r2", "r9"]))  # r2 lost; r9 is not known here
    (bundle,) = [b.read(s) for s in ups]
    (failed,) = bundle["content"]["failed"]
    assert failed[0] == 5 and failed[3] == P.UNREACHABLE
    assert failed[2] == "Relay node 0.0 lost the request (it restarted or dropped it); engine 5 did not answer"
    assert set(b.inflight.requests) == {"r1", "r3"} and b.calls == []


def test_a_childs_first_pong_is_answered_with_a_ping_listing_all_it_owes():
    b = Beating()  # a parent that restarted: it knows no child's boot yet
    b.waiting("r1", 1, [2])
    assert b.beats.pong(0, dict(boot="a")) == []  # it owes nothing
    (ask,) = b.beats.pong(1, dict(boot="b"))
    assert ask.socket == DOWN and ask.frames[0] == node_identity((0, 1))
    assert b.read(ask)["content"]["keys"] == ["r1"]
    assert b.beats.pong(1, dict(boot="b")) == []  # its boot is known now
    with pytest.raises(P.ProtocolError, match="unknown"):
        b.beats.pong(1, dict(boot="b", unknown="r1"))


def test_a_child_asked_names_the_requests_it_does_not_hold():
    b = Beating(path=(0, 1))
    b.inflight.requests["r1"] = Pending("r1", "m1", False, [], [])
    (pong,) = b.beats.parent_ping(dict(boot="p1", keys=["r1", "r2"]))
    assert b.read(pong)["content"]["unknown"] == ["r2"]
    (pong,) = b.beats.parent_ping(dict(boot="p1"))
    assert "unknown" not in b.read(pong)["content"]  # not asked
    with pytest.raises(P.ProtocolError, match="keys"):
        b.beats.parent_ping(dict(boot="p1", keys=[["r1"]]))


def test_host_relays_are_never_asked_for_requests():
    b = Beating(path=(0,))
    host = b.children.add_host(b"host-h1")
    b.beats.pong(host, dict(boot="x"))
    b.waiting("r1", host, [1])
    b.pings()
    assert "keys" not in b.pings()[host]


def test_the_pulse_link_takes_pongs_of_known_host_relays_only():
    b = Beating(path=(0,))
    host = b.children.add_host(b"host-h1")
    pong = [host] + b.codec.pack(P.PONG, dict(boot="x"))
    assert b.beats.on_pulse(pong) == [] and host in b.children.pulsing
    assert b.beats.on_pulse([b"host-h9"] + b.codec.pack(P.PONG, dict(boot="x"))) == []
    assert b.beats.on_parent_pulse(b.codec.pack(P.PONG, dict(boot="x"))) == []
    assert len(b.dropped) == 2 and all(why.startswith("pulse:") for why in b.dropped)


# ------------------------------------------------------------------ host fold
def test_the_host_fold_alone_drops_a_holder_past_its_turn_and_starts_again_without_it(tmp_path):
    """Two engines of this host hold values; the first's turn runs past its
    deadline: it fails (through the ``fail`` it was given), is told to let its
    value go, and the turns start again, in a new segment, with the other."""
    from ipyparallel_broadcast.host import shm
    from ipyparallel_broadcast.relay.hostfold import HostFold
    from ipyparallel_broadcast.relay.inflight import InFlight, Pending
    from ipyparallel_broadcast.relay.sharing import Sharing
    from ipyparallel_broadcast.relay.state import FOLD
    from ipyparallel_broadcast.wire.reduction import Held, Reduction

    b, failed, deadlines = Beating(path=(0,), host="h1"), [], Deadlines()  # (b: a codec and a clock)
    inflight = InFlight(b.codec, "engines", True, lambda: b.now, lambda: b.now)
    sharing = Sharing(b.codec, shm.ShmStore(threshold=1 << 12))
    fold = HostFold(
        NodeContext(b.codec, lambda: b.now, "host h1", "boot-1", False, "h1", b.drop),
        sharing,
        inflight,
        deadlines,
        turn_timeout=20.0,
        chunk=0,
        uplinks=None,
        rings=None,
        fail=lambda p, eids, code, why: failed.append((eids, code, why)) or [],
        settled=list,
    )
    p = inflight.requests["r1"] = Pending(key="r1", msg_id="m1", stream=False, route=[], inner=[])
    p.reduction, p.n = Reduction("sum"), 2
    for eid in (0, 1):
        fold.held(p, eid, f"uuid-{eid}", Held("float64", [1024], False, f"t{eid}", 8192))
    assert p.state.destinations == [FOLD] and fold.holds("r1") and fold.waiting() == 2
    (first,) = fold.go(p)
    assert first.frames[:2] == [b"uuid-0", P.FOLD_KEY] and b.read(Send(DOWN, first.frames[1:]))["content"]["first"]
    assert deadlines.next() == 20.0
    b.now = 20.0
    release, again = deadlines.fire(b.now)
    assert failed == [([0], P.UNREACHABLE, "did not combine its value within 20 s")]
    assert release.frames[0] == b"uuid-0" and b.kind(Send(DOWN, release.frames[1:])) == P.FOLD_RELEASE
    turn = b.read(Send(DOWN, again.frames[1:]))
    assert again.frames[0] == b"uuid-1" and turn["content"]["round"] == 2 and fold.waiting() == 1
    sharing.drop_value(fold.folds["r1"].turns.segment[0])  # (its name goes; nothing left in /dev/shm)


# -------------------------------------------------------------- reduce chains
def test_the_reduce_chains_alone_plan_a_chain_and_fail_its_engines_when_a_host_of_it_is_lost():
    """A leaf's ``ReduceChains`` with three host relays (chunk links, no node):
    the plan puts them in a chain by first engine id; two hosts' bundles say
    their values are in the chain; the middle host is lost: those engines
    fail, naming the chain, and the other hosts are told to let go."""
    from ipyparallel_broadcast.relay.dataplane.chains import Chains
    from ipyparallel_broadcast.relay.dataplane.push import CHUNK, THRESHOLD
    from ipyparallel_broadcast.relay.dataplane.reduce_trees import Uplinks
    from ipyparallel_broadcast.relay.inflight import InFlight, Pending
    from ipyparallel_broadcast.relay.reduce_chains import CHAIN, ReduceChains
    from ipyparallel_broadcast.wire.reduction import Reduction
    from ipyparallel_broadcast.wire.topology import host_ident

    b, failed = Beating(path=(0,)), []  # (b: a codec and a clock)
    children = Children((0,), [], lambda: b.now, 0.5, 10.0)
    hosts = [children.add_host(host_ident(f"h{i}")) for i in (2, 0, 1)]  # (said hello in any order)
    for h in hosts:
        children.bulk_link(h, f"tcp://{h.decode()}:1")
    inflight = InFlight(b.codec, "engines", True, lambda: b.now, lambda: b.now)
    chains = Chains(b.codec, 20.0, CHUNK)
    part = ReduceChains(
        NodeContext(b.codec, lambda: b.now, "node 0", "boot-1", False, None, b.drop),
        inflight,
        children,
        Deadlines(),
        threshold=THRESHOLD,
        chains=chains,
        uplinks=Uplinks(chains),
        shape="chain",
        fail=lambda p, eids, code, why: failed.append((eids, code, why)) or [],
    )
    p = inflight.requests["r1"] = Pending(key="r1", msg_id="m1", stream=False, route=[], inner=[])
    p.reduction = Reduction("sum")
    groups = {host_ident(f"h{i}"): [2 * i, 2 * i + 1] for i in (2, 0, 1)}
    for child, eids in groups.items():
        p.state.expect(child, eids)
    contents = part.plan(p, groups)
    assert set(contents) == set(hosts) and part.has(p) and part.shape == "chain" and p.state.owes(CHAIN)
    assert [c["chain"]["parts"][0]["to"] for c in (contents[host_ident(f"h{i}")] for i in range(3))] == [
        None,
        "tcp://ipb-host:h0:1",
        "tcp://ipb-host:h1:1",
    ]  # the chain in the order of first engine ids: h2 -> h1 -> h0 -> the leaf
    for i in (0, 2):
        part.chained(p, groups[host_ident(f"h{i}")], 2 * i)
    sends = part.host_lost(host_ident("h1"), "is unreachable")
    assert sorted(e for eids, _, _ in failed for e in eids) == [0, 1, 4, 5]
    named = "lost its value in the reduce chain (the chain of hosts h0, h1, h2: is unreachable)"
    assert all(code == P.UNREACHABLE and why == named for _, code, why in failed)
    assert sorted(s.frames[0] for s in sends) == [host_ident("h0"), host_ident("h2")]
    assert {b.kind(Send(DOWN, s.frames[1:])) for s in sends} == {P.CHAIN_END} and not part.open


# ------------------------------------------------------------------ chunks in
def test_a_host_relays_chunk_socket_alone_assembles_a_push_whose_chunks_came_first_and_drops_junk():
    """``ChunksIn`` with the data plane (``BigData``) and no node: a leaf's
    ``PushOut`` cuts a buffer into chunks; they reach the host before the
    request's envelope (another link), then the envelope comes: the request
    goes on (``go_on``) with the exact bytes. A message that is no chunk is
    dropped through the ``drop`` it was given."""
    import os

    from ipyparallel_broadcast.relay.bigdata import BigData
    from ipyparallel_broadcast.relay.chunks_in import ChunksIn
    from ipyparallel_broadcast.relay.dataplane.push import PushOut
    from ipyparallel_broadcast.relay.inflight import InFlight, Pending
    from ipyparallel_broadcast.relay.sharing import Sharing
    from ipyparallel_broadcast.wire.topology import host_ident

    b, went = Beating(path=(0,), host="h1"), []  # (b: a codec, a clock and a drop)
    ctx = NodeContext(b.codec, lambda: b.now, "host h1", "boot-1", False, "h1", b.drop)
    spec = dict(chunk=1024, threshold=2048)
    inflight, sharing = InFlight(b.codec, "engines", True, lambda: b.now, lambda: b.now), Sharing(b.codec, None)
    children = Children((0,), [], lambda: b.now, 0.5, 10.0)
    big = BigData.build(ctx, inflight, children, sharing, Deadlines(), stall=20.0, spec=spec, fail=None, stalled=list)
    chunks_in = ChunksIn(ctx, inflight, sharing, big, go_on=lambda p, targets: went.append((p, targets)) or [])

    data = os.urandom(10_000)  # 10 chunks, the last short
    request = [b"sig", b"{}", b"{}", b"{}", b"{}", data]
    leaf = PushOut(P.Codec(Session(key=b"k")), lambda: b.now, **spec)
    sent = Pending(key="r1", msg_id="m1", stream=False, route=[], inner=request)
    out = leaf.start(sent, [(host_ident("h1"), "tcp://h1:1")], "boot-0")
    content, frames = leaf.envelope(out, host_ident("h1"), request)
    for send in leaf.first_sends(out):
        assert chunks_in.on_chunk([b"leaf"] + send.frames[2:]) == []  # (early: its envelope is on its way)

    p = inflight.requests["r1"] = Pending(key="r1", msg_id="m1", stream=False, route=[], inner=frames)
    assert chunks_in.expect(p, content, [3, 4]) == []  # (it feeds no other host)
    ((came, targets),) = went
    assert came is p and targets == [3, 4] and bytes(p.inner[5]) == data and big.push_in.received == 10

    assert chunks_in.on_chunk([b"leaf", b"junk"]) == [] and chunks_in.on_chunk([b"leaf"]) == []
    assert len(b.dropped) == 2 and all(why.startswith("chunk:") for why in b.dropped)


# ------------------------------------------------------------- the two flows
def test_a_leafs_two_flows_alone_send_a_request_to_its_engines_and_fail_a_lost_one_by_name():
    """``DownFlow`` and ``UpFlow`` built from ``FlowParts`` and no node: a
    leaf's request to engines 0 and 2 goes to each engine's identity; engine
    4, not in the engine table yet, parks the request and asks the hub.
    Engine 0 answers; engine 2 dies: the request's bundle goes up with engine
    0's reply and engine 2's failure, named."""
    from itertools import count

    from ipyparallel_broadcast.relay.bigdata import BigData
    from ipyparallel_broadcast.relay.down import DownFlow
    from ipyparallel_broadcast.relay.engines import EngineTable
    from ipyparallel_broadcast.relay.flow import FlowParts
    from ipyparallel_broadcast.relay.forwarding import Forwarding
    from ipyparallel_broadcast.relay.inflight import InFlight
    from ipyparallel_broadcast.relay.routes import Announcements, Routes
    from ipyparallel_broadcast.relay.sharing import Sharing
    from ipyparallel_broadcast.relay.surveys import Surveys
    from ipyparallel_broadcast.relay.up import UpFlow
    from ipyparallel_broadcast.wire import bundles as B
    from ipyparallel_broadcast.wire.topology import TreeShape

    b = Beating(path=(0,))  # (b: a codec, a clock, a drop, and heartbeats to hand UpFlow)
    ctx = NodeContext(b.codec, lambda: b.now, "node 0", "boot-1", False, None, b.drop)
    engines = EngineTable()
    engines.update({0: "uuid-0", 2: "uuid-2"})  # (leaf 0 of two serves the even ids)
    inflight = InFlight(b.codec, "engines", True, lambda: b.now, lambda: b.now, engines)
    routes, sharing = Routes(TreeShape(1, 2), (0,), True), Sharing(b.codec, None)
    children = Children((0,), [], lambda: b.now, 0.5, 10.0)
    big = BigData.build(ctx, inflight, children, sharing, Deadlines(), stall=20.0, spec={}, fail=None, stalled=list)
    forwarding = Forwarding(ctx, inflight, children, 16, lambda: None, Deadlines(), 10.0)
    parts = FlowParts(ctx, True, inflight, engines, routes, children, sharing, big, forwarding)
    down = DownFlow(parts, wall=lambda: b.now, keys=count(), big_from=1 << 20)
    announce = Announcements(b.codec, routes, children.idents, False, None, "boot-1")
    up = UpFlow(parts, announce=announce, surveys=Surveys(b.codec), heartbeats=b.beats)

    inner_msg = b.codec.session.msg("apply_request", content={}, metadata={})
    inner = b.codec.session.serialize(inner_msg)[1:] + [b"payload"]
    content = dict(P.request_content(inner_msg["header"]["msg_id"], [0, 2], P.COALESCE), req="r1")
    sends = down.start([b"client"], content, inner)
    assert sorted(P.as_bytes(s.frames[0]) for s in sends if s.socket == DOWN) == [b"uuid-0", b"uuid-2"]
    assert inflight.requests["r1"].state.owes("uuid-0") and inflight.requests["r1"].state.owes("uuid-2")

    later = dict(P.request_content("m2", [4], P.COALESCE), req="r2")
    asked = down.start([b"client"], later, inner)
    assert [s.socket for s in asked] == ["hub"] and "r2" in inflight.parked  # parked until the hub answers

    reply = b.codec.session.msg(
        "apply_reply", content=dict(status="ok", eid=0), parent=inner_msg["header"], metadata=dict(engine="uuid-0")
    )
    body = b.codec.session.serialize(reply)[1:]
    assert up.engine_reply(E.EngineReply(b"uuid-0", "uuid-0", "r1", body)) == []  # (one engine still owes)
    (bundle,) = up.engine_lost("uuid-2", P.DIED)
    assert bundle.socket == UP and not b.dropped
    _, frames = P.split_idents(bundle.frames)
    items = list(B.iter_bundle(b.codec, b.codec.unpack(frames)))
    failures = [item for what, item in items if what not in ("reply", "parsed")]
    assert len(items) == 2 and [f[0] for f in failures] == [2] and "Engine 2" in failures[0][2]


# ------------------------------------------------------------------ reduce rings
def test_a_leafs_reduce_rings_alone_plan_a_ring_in_engine_order_and_end_it_when_a_host_is_lost():
    """``ReduceRings`` with no node: an allreduce over three host relays (that
    said hello in any order) gets a ring in the order of their first engine
    ids, each host told the ring's chunk sockets and its place; a request
    with a target off the hosts gets none. The middle host is lost: the
    other two are told to let go, naming the cause, and the lost one is not."""
    from ipyparallel_broadcast.relay.dataplane.chains import Chains
    from ipyparallel_broadcast.relay.dataplane.push import CHUNK, THRESHOLD
    from ipyparallel_broadcast.relay.dataplane.ring import Rings
    from ipyparallel_broadcast.relay.inflight import InFlight, Pending
    from ipyparallel_broadcast.relay.reduce_rings import ReduceRings
    from ipyparallel_broadcast.relay.sharing import Sharing
    from ipyparallel_broadcast.wire.topology import host_ident

    b = Beating(path=(0,))  # (b: a codec and a clock)
    children = Children((0,), [], lambda: b.now, 0.5, 10.0)
    hosts = [children.add_host(host_ident(f"h{i}")) for i in (2, 0, 1)]  # (said hello in any order)
    for h in hosts:
        children.bulk_link(h, f"tcp://{h.decode()}:1")
    inflight = InFlight(b.codec, "engines", True, lambda: b.now, lambda: b.now)
    rings = Rings(b.codec, Chains(b.codec, 20.0, CHUNK), THRESHOLD, lambda: b.now, 20.0)
    ctx = NodeContext(b.codec, lambda: b.now, "node 0", "boot-1", False, None, b.drop)
    part = ReduceRings(ctx, inflight, children, Sharing(b.codec, None), Deadlines(), rings)

    p = inflight.requests["r1"] = Pending(key="r1", msg_id="m1", stream=False, route=[], inner=[], ring_ok=True)
    groups = {host_ident(f"h{i}"): [2 * i, 2 * i + 1] for i in (2, 0, 1)}
    assert part.plan(p, groups, direct=[9]) == {}  # (a target served off the hosts: no ring)
    contents = part.plan(p, groups, direct=None)
    assert part.has(p) and set(contents) == set(hosts)
    urls = ["tcp://ipb-host:h0:1", "tcp://ipb-host:h1:1", "tcp://ipb-host:h2:1"]
    assert [contents[host_ident(f"h{i}")]["ring"] for i in range(3)] == [dict(urls=urls, at=i) for i in range(3)]

    sends = part.host_lost(host_ident("h1"), "is unreachable")
    assert sorted(s.frames[0] for s in sends) == [host_ident("h0"), host_ident("h2")] and not part.has(p)
    ended = [b.read(Send(DOWN, s.frames[1:])) for s in sends]
    assert all(m["msg_type"] == P.CHAIN_END for m in ended)
    assert all(
        m["content"] == dict(keys=["r1"], why="the ring of hosts ended: it lost a host: is unreachable") for m in ended
    )
    assert part.host_lost(host_ident("h0"), "is unreachable") == []  # (that ring is gone already)
