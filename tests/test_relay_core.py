"""The pure relay core, driven through an in-memory tree (no sockets)."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jupyter_client.session import Session
from treesim import TreeSim

from ipyparallel_broadcast.relay.node import RelayNode
from ipyparallel_broadcast.wire import bundles as B
from ipyparallel_broadcast.wire import protocol as P
from ipyparallel_broadcast.wire.topology import TreeShape

pytestmark = pytest.mark.pure

ENGINES = list(range(11))
shapes = st.tuples(st.integers(0, 3), st.integers(2, 4))


@settings(max_examples=60, deadline=None)
@given(shapes, st.lists(st.sampled_from(ENGINES), unique=True), st.booleans())
def test_every_target_answered_once(shape, targets, stream):
    sim = TreeSim(*shape, ENGINES)
    sim.request(targets, stream=stream)
    replies, failures, n_messages = sim.outcomes()
    assert sorted(replies) == sorted(targets) and not failures
    for eid in ENGINES:  # each engine got the request only if targeted
        assert len(sim.engine_inbox[eid]) == (eid in targets)
    if stream:
        assert n_messages == len(targets)
    else:
        assert n_messages == 1
    assert sim.pending_total() == 0


def test_leaves_send_identical_frames():
    sim = TreeSim(1, 2, ENGINES)
    sim.request(ENGINES)
    inner = [tuple(P.as_bytes(f) for f in sim.engine_inbox[e][0][3:]) for e in ENGINES]
    assert len(set(inner)) == 1, "every engine gets the same signed frames"


@settings(max_examples=40, deadline=None)
@given(
    shapes,
    st.lists(st.sampled_from(ENGINES), unique=True, min_size=1),
    st.data(),
    st.booleans(),
)
def test_dead_engines_fail_and_survivors_arrive(shape, targets, data, stream):
    sim = TreeSim(*shape, ENGINES)
    dead = data.draw(st.lists(st.sampled_from(targets), unique=True))
    sim.hold.update(dead)
    sim.request(targets, stream=stream)
    assert sim.pending_total() > 0 or not dead
    for eid in dead:
        sim.kill(eid)
    replies, failures, _ = sim.outcomes()
    assert sorted(replies) == sorted(set(targets) - set(dead))
    assert sorted(failures) == sorted(dead)
    assert all("died" in f[2] for f in failures.values())
    assert sim.pending_total() == 0


def test_child_lost_fails_its_subtree():
    sim = TreeSim(2, 2, ENGINES)
    sim.hold.update(ENGINES)
    sim.request(ENGINES)
    root = sim.nodes[()]
    sim._run(root, root.on_child_lost(1, "died"), ())
    for eid in ENGINES:
        sim.release(eid)
    replies, failures, n = sim.outcomes()
    lost = [e for e in ENGINES if sim.shape.child_digit((), e) == 1]
    assert sorted(failures) == lost
    assert sorted(replies) == sorted(set(ENGINES) - set(lost))
    assert "Relay node 1 died" in failures[lost[0]][2]
    assert n == 1
    # the orphaned subtree's late bundle was dropped at the root, not delivered
    assert root.dropped == 1
    assert len(root.pending) == 0


def test_unknown_engine_is_looked_up_then_failed():
    sim = TreeSim(1, 2, [0, 1])
    sim.request([0, 1, 5])
    replies, failures, _ = sim.outcomes()
    assert sorted(replies) == [0, 1] and list(failures) == [5]
    assert "not registered" in failures[5][2]
    assert sim.hub_lookups == 1 and sim.pending_total() == 0


def test_engine_registered_late_is_found_by_lookup():
    sim = TreeSim(1, 2, [0, 1])
    sim.engines[3] = sim.hub_engines[3] = "uuid-0003"
    sim.engine_inbox[3] = []
    sim.request([3])  # the leaf has not heard of engine 3; the hub has
    replies, failures, _ = sim.outcomes()
    assert list(replies) == [3] and not failures


def test_empty_targets():
    sim = TreeSim(1, 3, ENGINES)
    sim.request([])
    replies, failures, n = sim.outcomes()
    assert not replies and not failures and n == 1
    assert sim.pending_total() == 0


def node_and_codec(depth=1, key=b"secret"):
    codec = P.Codec(Session(key=key))
    return RelayNode(P.Codec(Session(key=b"secret")), TreeShape(depth, 2), ()), codec


def test_forged_and_malformed_requests_are_dropped():
    node, _ = node_and_codec()
    forger = P.Codec(Session(key=b"wrong"))
    bad = [
        [b"c"],
        [b"c", P._DELIM, b"sig"],
        [b"c", P._DELIM, b"x", b"{", b"{}", b"{}", b"{}"],
        [b"c"] + forger.pack(P.REQUEST, P.request_content("m", [0], P.COALESCE)),
    ]
    good = P.Codec(Session(key=b"secret"))
    for content in (
        {"targets": "all"},
        {"targets": [0, 0], "reply": "coalesce", "msg_id": "m"},
        {"targets": [-1], "reply": "coalesce", "msg_id": "m"},
        {"targets": [0], "reply": "sometimes", "msg_id": "m"},
    ):
        bad.append([b"c"] + good.pack(P.REQUEST, content))
    for frames in bad:
        assert node.on_up(frames) == []
    assert node.dropped == len(bad)
    assert not node.pending


def test_replayed_request_is_dropped():
    node, _ = node_and_codec()
    good = P.Codec(Session(key=b"secret"))
    inner = good.session.serialize(good.session.msg("apply_request", content={}))[1:]
    frames = [b"c"] + good.pack(P.REQUEST, P.request_content("m", [0, 1], P.COALESCE), inner)
    assert node.on_up(list(frames))
    assert node.on_up(list(frames)) == []
    assert node.dropped == 1


def test_unexpected_replies_are_dropped():
    sim = TreeSim(1, 2, ENGINES)
    leaf = sim.nodes[(0,)]
    reply = sim.session.serialize(sim.session.msg("apply_reply", content={}))
    assert leaf.on_down([b"uuid-0000", b"r99"] + reply) == []
    assert leaf.on_down([b"uuid-0000"] + reply) == []
    root = sim.nodes[()]
    bundle = B.pack_bundle(sim.codec, "r0", "m", "engines", [], [], [])
    assert root.on_down([b"ipb-node:7", P._DELIM] + bundle) == []
    assert root.on_down([b"ipb-node:0", P._DELIM] + bundle) == []
    assert leaf.dropped == 2 and root.dropped == 2


@settings(max_examples=30, deadline=None)
@given(shapes, st.lists(st.sampled_from(ENGINES), unique=True, min_size=1), st.booleans(), st.data())
def test_stock_client_requests(shape, targets, coalescing, data):
    """Requests from ipyparallel's own BroadcastView get ipyparallel's replies."""
    from treesim import stock_request

    sim = TreeSim(*shape, ENGINES)
    dead = data.draw(st.lists(st.sampled_from(targets), unique=True, max_size=2))
    sim.hold.update(dead)
    msg_id = stock_request(sim, targets, coalescing)
    for eid in dead:
        sim.kill(eid)
    replies = [sim.codec.unpack(P.split_idents(f)[1]) for f in sim.client_inbox]
    assert all(n.dropped == 0 for n in sim.nodes.values())
    assert sim.pending_total() == 0
    # engines the hub unregistered are the stock client's to fail (it would
    # choke on a second answer); everything else is answered by the tree
    if coalescing:
        assert len(replies) == (0 if dead else 1)
        for reply in replies:
            md = reply["metadata"]
            assert md["original_msg_id"] == msg_id and md["is_coalescing"]
            assert [t[1] for t in md["broadcast_targets"]] == targets
            assert reply["content"]["status"] == "ok"
    else:
        alive = [e for e in targets if e not in dead]
        assert len(replies) == len(alive)
        got = {r["parent_header"]["msg_id"] for r in replies}
        assert got == {f"{msg_id}_uuid-{e:04d}" for e in alive}


def test_stock_client_gets_errors_the_hub_does_not_send():
    """An unknown target is not reported by the hub: the tree answers it."""
    from treesim import stock_request

    sim = TreeSim(1, 2, [0, 1])
    msg_id = stock_request(sim, [0, 1, 7], coalescing=False)
    replies = [sim.codec.unpack(P.split_idents(f)[1]) for f in sim.client_inbox]
    errors = [r for r in replies if r["content"]["status"] == "error"]
    assert len(replies) == 3 and len(errors) == 1
    assert errors[0]["parent_header"]["msg_id"] == f"{msg_id}_uuid-0007"
    assert errors[0]["content"]["ename"] == "EngineError"
    assert "Engine 7 is not registered" in errors[0]["content"]["evalue"]


def test_leaf_drops_badly_signed_engine_replies():
    sim = TreeSim(0, 2, [0, 1])
    sim.hold.update([0, 1])
    sim.request([0, 1])
    leaf = sim.nodes[()]
    ((_, frames),) = sim.held[0]
    idents, body = P.split_idents(frames[1:])
    reply = sim.session.msg("apply_reply", content={"status": "ok", "eid": 0})
    signed = sim.session.serialize(reply)[1:]
    forged = [b"0" * len(signed[0])] + signed[1:]
    assert leaf.on_down([b"uuid-0000"] + idents + [P._DELIM] + forged) == []
    assert leaf.dropped == 1 and len(leaf.pending) == 1  # still waiting for the real one
    sim.release(0)
    sim.release(1)
    replies, failures, _ = sim.outcomes()
    assert sorted(replies) == [0, 1] and not failures


def test_tampered_replies_table_is_refused():
    """A replies table is covered by the bundle's signature: its content
    directly, each reply's text through the digest in it."""
    sim = TreeSim(0, 2, [0, 1])
    sim.request([0, 1])
    (frames,) = sim.client_inbox
    _, body = P.split_idents(frames)

    def codec():  # a new one per message: each refuses replays
        return P.Codec(Session(key=b"secret"))

    content = P.as_bytes(body[4]).replace(b"uuid-0000", b"uuid-0009")
    assert content != P.as_bytes(body[4])
    with pytest.raises(P.ProtocolError):
        codec().unpack(body[:4] + [content] + body[5:])
    texts = re.sub(rb'("eid": ?)0', rb"\g<1>9", P.as_bytes(body[5]))  # (json or orjson text)
    assert texts != P.as_bytes(body[5])
    with pytest.raises(P.ProtocolError, match="digest"):
        list(B.iter_bundle(codec(), codec().unpack(body[:5] + [texts] + body[6:])))
    msg = codec().unpack(body)
    assert msg["metadata"]["kind"] == "replies"
    assert [reply["content"]["eid"] for _, reply in B.iter_bundle(codec(), msg)] == [0, 1]


def test_bad_inner_request_for_stock_leaf_leaves_no_state():
    node = RelayNode(P.Codec(Session(key=b"secret")), TreeShape(0, 2), ())
    good = P.Codec(Session(key=b"secret"))
    content = P.request_content("m", [0], P.STREAM, req="r1", compat="rename")
    frames = [b"c"] + good.pack(P.REQUEST, content, [b"not", b"a", b"message"])
    assert node.on_up(frames) == []
    assert node.dropped == 1 and not node.pending


def test_interior_nodes_do_not_parse_results():
    """A root checks a child's bundle signature and reads its metadata only:
    content it cannot parse is still relayed, untouched, to the client."""
    sim = TreeSim(1, 2, [0, 1])
    sim.hold.update([0, 1])
    sim.request([0, 1])
    root = sim.nodes[()]
    (key,) = root.pending
    for digit in (0, 1):
        msg = sim.session.msg(
            P.BUNDLE,
            content=b"opaque, not JSON",
            metadata=B.bundle_metadata(key, "m", "replies"),
        )
        frames = [b"ipb-node:%d" % digit] + sim.session.serialize(msg)
        sim._run(root, root.on_down(frames), ())
    assert root.dropped == 0 and not root.pending
    (frames,) = sim.client_inbox
    _, body = P.split_idents(frames)
    outer = sim.codec.unpack(body)
    buffers = P.split_joined(outer["content"]["packed"], outer["buffers"])  # (its small frames joined)
    assert [P.as_bytes(f) for f in buffers].count(b"opaque, not JSON") == 2
    with pytest.raises(P.ProtocolError):
        list(B.iter_bundle(sim.codec, outer))  # the client, not the root, finds it bad


def survey(sim, **content):
    root = sim.nodes[()]
    sim.client_inbox.clear()
    sim._run(root, root.on_up([b"c"] + sim.codec.pack(P.STATS, {"msg_id": "q", **content})), ())
    (reply,) = sim.client_inbox
    msg = sim.codec.unpack(P.split_idents(reply)[1])
    assert msg["header"]["msg_type"] == P.STATS_REPLY and msg["content"]["msg_id"] == "q"
    return {n["node"]: n for n in msg["content"]["nodes"]}


@pytest.mark.parametrize("depth,fanout", [(0, 2), (1, 3), (2, 2)])
def test_stats_survey_reaches_every_node(depth, fanout):
    sim = TreeSim(depth, fanout, ENGINES)
    sim.hold.add(3)
    sim.request(ENGINES)
    nodes = survey(sim)
    assert sorted(nodes) == sorted(n.name for n in sim.nodes.values())
    leaf3 = sim.nodes[sim.shape.leaf_path(3)].name
    busy = {name for name, n in nodes.items() if n["pending"]}
    assert leaf3 in busy and "root" in busy  # the request waits for engine 3 there
    served = {sim.nodes[p].name: len(es) for p, es in sim.shape.layout(ENGINES).items()}
    assert all(nodes[name]["engines"] == n for name, n in served.items())
    sim.release(3)
    assert all(n["pending"] == 0 and n["surveys"] == 0 for n in survey(sim).values())


def test_stats_survey_reports_a_lost_child():
    shape = TreeShape(1, 2)
    root = RelayNode(P.Codec(Session(key=b"k")), shape, ())
    client = P.Codec(Session(key=b"k"))
    sends = root.on_up([b"c"] + client.pack(P.STATS, {"msg_id": "q"}))
    assert [s.socket for s in sends] == ["down", "down"]
    assert root.on_child_lost(0) == []  # child 1 still owes its part
    (reply,) = root.on_child_lost(1, "was killed")
    nodes = client.unpack(P.split_idents(reply.frames)[1])["content"]["nodes"]
    assert [n["node"] for n in nodes] == ["root", "0", "1"]
    assert "relay node 1 was killed" in nodes[2]["error"] and not root.surveys


@pytest.mark.parametrize("stream", [False, True], ids=["coalescing", "streaming"])
def test_a_traced_request_is_stamped_at_every_node_and_a_survey_fetches_it(stream):
    sim = TreeSim(2, 2, ENGINES)
    msg_id = sim.request(ENGINES, stream=stream, trace=True)
    untraced = sim.request(ENGINES, stream=stream)
    nodes = survey(sim, trace=msg_id)
    assert sorted(nodes) == sorted(n.name for n in sim.nodes.values())
    for path, node in sim.nodes.items():
        events = nodes[node.name]["trace"]
        kinds = [e[0] for e in events]
        assert kinds[:2] == ["request in", "request out"] and kinds[-1] == "reply out"
        times = [e[1] for e in events]
        assert times == sorted(times)
        served = [e for e in ENGINES if sim.shape.serves(path, e)]
        below = len(served) if node.is_leaf or stream else sim.shape.fanout
        assert kinds.count("reply in") == below  # each engine's reply, or each bundle from below
        if node.is_leaf:
            assert sorted(e[2] for e in events if e[0] == "reply in") == sorted(f"engine {e}" for e in served)
    assert all(survey(sim, trace=untraced)[n]["trace"] == [] for n in nodes)  # not traced: nothing kept
    for node in sim.nodes.values():  # finished traces are kept, a bounded number
        node.inflight.traces_kept = 1
    sim.request(ENGINES, stream=stream, trace=True)
    assert all(survey(sim, trace=msg_id)[n]["trace"] == [] for n in nodes)


def test_the_root_tells_a_client_which_requests_it_does_not_hold():
    sim = TreeSim(1, 2, ENGINES)
    sim.hold.add(3)
    held = sim.request(ENGINES)
    done = sim.request([0, 1])
    root = sim.nodes[()]
    sim.client_inbox.clear()
    (pong,) = root.on_up([b"client-1"] + sim.codec.pack(P.PING, {"ids": [held, done, "never-sent"]}))
    assert pong.socket == "up" and pong.frames[0] == b"client-1"
    content = sim.codec.unpack(P.split_idents(pong.frames)[1])["content"]
    assert content["unknown"] == [done, "never-sent"] and content["boot"] == root.boot
    assert root.on_up([b"client-1"] + sim.codec.pack(P.PING, {"ids": "x"})) == []  # dropped
    assert root.dropped == 1


@pytest.mark.parametrize("hosts", [False, True], ids=["leaves", "host relays"])
def test_streamed_replies_read_together_go_up_together(hosts):
    layout = {"a": (0, [0, 1, 2]), "b": (1, [3, 4])} if hosts else None
    sim = TreeSim(2, 2, ENGINES, hosts=layout, coalesce=True)
    sim.hold.add(4)
    sim.request(ENGINES, stream=True)
    assert sim.client_inbox == []  # held until each shell has read what waits
    sim.drain()
    assert len(sim.client_inbox) == 1  # the ten that were ready, in one message
    sim.release(4)  # the last outcome finishes the request: up at once, no drain needed
    replies, failures, n_messages = sim.outcomes()
    assert sorted(replies) == ENGINES and not failures
    assert n_messages == 2 and sim.pending_total() == 0


@settings(max_examples=40, deadline=None)
@given(shapes, st.data())
def test_coalesced_streams_answer_every_target_once(shape, data):
    sim = TreeSim(*shape, ENGINES, coalesce=True)
    order = data.draw(st.permutations(ENGINES))
    dead = set(data.draw(st.lists(st.sampled_from(ENGINES), unique=True, max_size=3)))
    sim.hold.update(ENGINES)
    sim.request(ENGINES, stream=True)
    for eid in order:  # replies and deaths, with the shells reading at random moments
        sim.kill(eid) if eid in dead else sim.release(eid)
        if data.draw(st.booleans()):
            sim.drain()
    sim.drain()
    replies, failures, n_messages = sim.outcomes()
    assert sorted(replies) == sorted(set(ENGINES) - dead) and sorted(failures) == sorted(dead)
    assert n_messages <= len(ENGINES) and sim.pending_total() == 0


def test_a_leaf_greets_an_engine_registered_alone_but_not_a_hosts_batch():
    """An engine registered alone may be connected to this leaf: it is greeted
    (asked whether it shares this host's memory). A host's batch of engines is
    served by that host's relay, which greets them: a leaf that greeted them
    too would send one undeliverable message per engine, and remember each."""
    from ipyparallel_broadcast.host.shm import ShmStore

    store = ShmStore(threshold=1 << 20)  # (makes no segment until a buffer is shared)
    codec = P.Codec(Session(key=b"secret"))
    node = RelayNode(codec, TreeShape(1, 2), (0,), store=store)

    def hub(kind, content):
        return [b"hub"] + codec.pack(kind, content)

    batch = node.on_hub(hub(P.REGISTRATIONS, dict(engines={"0": "host-0", "2": "host-2"})))
    assert [s for s in batch if P.HELLO_KEY in s.frames[:2]] == []
    alone = node.on_hub(hub(P.REGISTERED, dict(id=4, uuid="alone-4")))
    assert [s.frames[0] for s in alone if P.HELLO_KEY in s.frames[:2]] == [b"alone-4"]
    assert node.engines == {0: "host-0", 2: "host-2", 4: "alone-4"}
    assert node.sharing.greeted == {"alone-4"}


def test_the_engine_table_finds_an_engine_by_uuid_as_a_dict_would():
    """``EngineTable``'s inverse index agrees with a scan of the table after any
    sequence of the changes the node's parts make."""
    from ipyparallel_broadcast.relay.engines import EngineTable

    ops = st.one_of(
        st.tuples(st.just("set"), st.integers(0, 6), st.sampled_from("abcd")),
        st.tuples(st.just("del"), st.integers(0, 6), st.none()),
        st.tuples(st.just("update"), st.dictionaries(st.integers(0, 6), st.sampled_from("abcd")), st.none()),
        st.tuples(st.just("setdefault"), st.integers(0, 6), st.sampled_from("abcd")),
        st.tuples(st.just("clear"), st.none(), st.none()),
    )

    @settings(max_examples=300, deadline=None)
    @given(st.lists(ops, max_size=30))
    def check(changes):
        table, model = EngineTable(), {}
        for op, a, b in changes:
            for t in (table, model):
                if op == "set":
                    t[a] = b
                elif op == "del":
                    t.pop(a, None)
                elif op == "update":
                    t.update(a)
                elif op == "setdefault":
                    t.setdefault(a, b)
                else:
                    t.clear()
            assert table == model
            for uuid in "abcd":
                assert table.eids_of(uuid) == sorted(e for e, u in model.items() if u == uuid)

    check()
