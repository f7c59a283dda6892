"""Big requests to host relays in pipelined chunks (``relay.dataplane.push``, ``push_in``), in the pure core.

The leaf sends each host its request less the big buffers, and the chunks
along a tree of hosts; every engine gets the whole request once, checked.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jupyter_client.session import Session
from treesim import TreeSim

from ipyparallel_broadcast.relay.dataplane.plans import heap as plan
from ipyparallel_broadcast.relay.dataplane.push import CHUNK_MSG, Layout
from ipyparallel_broadcast.relay.dataplane.push_in import PushIn
from ipyparallel_broadcast.wire import protocol as P

pytestmark = pytest.mark.pure

CHUNK = 1000  # bytes: small, so that tests have many chunks


def bed(n_hosts=4, per_host=2, fanout=1, chunk=CHUNK, threshold=CHUNK, push="auto"):
    hosts = {f"h{i}": (0, list(range(i * per_host, (i + 1) * per_host))) for i in range(n_hosts)}
    engines = list(range(n_hosts * per_host))
    spec = dict(chunk=chunk, threshold=threshold, fanout=fanout, push=push)
    sim = TreeSim(0, 2, engines, hosts=hosts, bulk=spec)
    return sim, engines


def big_inner(sim, *buffers):
    msg = sim.session.msg("apply_request", content={}, metadata={})
    return sim.session.serialize(msg)[1:] + list(buffers)


def buffers_got(sim, eid):
    (frames,) = sim.engine_inbox[eid]
    _, body = P.split_idents(frames[1:])
    return [P.as_bytes(b) for b in body[5:]]


def data(n, seed=0):
    return bytes((i * 7 + seed) % 251 for i in range(n))


@pytest.mark.parametrize("fanout", [1, 2, 3])
def test_every_engine_gets_the_whole_request_once_and_the_leaf_sends_fanout_copies(fanout):
    sim, engines = bed(n_hosts=5, fanout=fanout)
    big, small = data(10_500), b"small"
    sim.request(engines, inner=big_inner(sim, small, big))
    replies, failures, _ = sim.outcomes()
    assert sorted(replies) == engines and not failures
    for e in engines:
        assert buffers_got(sim, e) == [small, big]
    n = Layout(((1, len(big)),), CHUNK).n
    assert n == 11
    leaf = sim.nodes[()]
    assert leaf.big.push_out.sent == min(fanout, 5) * n  # the rest is forwarded host to host
    assert all(count == n for count in sim.chunks_at.values())  # each host got each chunk once
    for host in sim.chunks_at:  # the control link carried no big buffer
        (request,) = [
            f
            for f in sim.node_inbox[host]
            if sim.codec.unpack(P.split_idents(f)[1], content=False)["msg_type"] == P.REQUEST
        ]
        assert sum(P.nbytes(f) for f in request) < 2000
    assert sim.pending_total() == 0
    assert all(not n.big.push_out.outgoing for n in sim.nodes.values())


@pytest.mark.parametrize("n_hosts", [2, 3, 7, 10])
def test_two_trees_deliver_every_chunk_once_and_each_host_sends_about_one_copy(n_hosts):
    sim, engines = bed(n_hosts=n_hosts, fanout=0, push="two trees")
    big = data(12_345)
    sim.request(engines, inner=big_inner(sim, big))
    replies, failures, _ = sim.outcomes()
    assert sorted(replies) == engines and not failures
    assert all(buffers_got(sim, e) == [big] for e in engines)
    n = Layout(((0, len(big)),), CHUNK).n
    leaf = sim.nodes[()]
    assert leaf.big.push_out.last["shape"] == "two trees"
    assert leaf.big.push_out.sent == n  # even chunks to one tree's root, odd to the other's
    assert all(count == n for count in sim.chunks_at.values())  # each host got each chunk once
    forwarded = [sim.nodes[h].big.push_in.forwarded for h in sim.chunks_at]
    assert sum(forwarded) == (n_hosts - 1) * n  # every host but the roots is fed each chunk once
    assert max(forwarded) <= 2 * -(-n // 2)  # interior in one tree at most: two children, half the chunks


def test_two_trees_heal_around_a_hung_host_in_both_trees():
    sim, engines = bed(n_hosts=7, fanout=0, push="two trees")
    hung = ("h", "h5")  # interior in the mirrored tree (feeds h3 and h2 its odd chunks), a leaf of the first
    sim.down_nodes[hung] = "hung"
    big = data(9_000)
    sim.request(engines, inner=big_inner(sim, big))
    leaf = sim.nodes[()]
    for _ in range(int(leaf.node_timeout / leaf.ping_interval) + 2):
        sim.tick(leaf.ping_interval)
    replies, failures, _ = sim.outcomes()
    assert sorted(failures) == [10, 11] and sorted(replies) == [e for e in engines if e not in (10, 11)]
    for e in replies:
        assert len(sim.engine_inbox[e]) == 1 and buffers_got(sim, e) == [big]
    assert sim.pending_total() == 0


def test_the_chunk_size_follows_the_link_the_leaf_timed():
    from ipyparallel_broadcast.relay.dataplane.model import Link
    from ipyparallel_broadcast.relay.dataplane.pushplan import MIN_CHUNK, Gauge, plan_push

    gauge = Gauge()
    fast = plan_push(8, 64 << 20, gauge.link).chunk
    gauge.timed(64 << 20, 3.0, 8, 128)  # ~190 Mbit/s: a slow link
    slow = plan_push(8, 64 << 20, gauge.link).chunk
    assert MIN_CHUNK <= slow < fast
    assert 150e6 < gauge.bits_per_second < 200e6
    gauge.timed(64 << 20, 30.0, 8, 128)  # a push whose engines took long: not a slower link
    assert plan_push(8, 64 << 20, gauge.link).chunk == slow
    assert gauge.link == Link(gauge.start.alpha, min(gauge.betas))


def test_small_requests_keep_the_one_message_path():
    sim, engines = bed()
    sim.request(engines, inner=big_inner(sim, data(CHUNK - 1)))
    replies, failures, _ = sim.outcomes()
    assert sorted(replies) == engines and not failures
    assert sum(sim.chunks_at.values()) == 0


@settings(max_examples=40, deadline=None)
@given(
    n_hosts=st.integers(1, 9),
    fanout=st.integers(0, 4),
    sizes=st.lists(st.integers(0, 5000), max_size=3),
    chunk=st.integers(300, 3000),
    push=st.sampled_from(["auto", "chain", "two trees"]),
)
def test_any_sizes_chunks_and_tree_deliver_the_exact_bytes(n_hosts, fanout, sizes, chunk, push):
    sim, engines = bed(n_hosts=n_hosts, per_host=1, fanout=fanout, chunk=chunk, threshold=1000, push=push)
    buffers = [data(n, seed=i) for i, n in enumerate(sizes)]
    sim.request(engines, inner=big_inner(sim, *buffers))
    replies, failures, _ = sim.outcomes()
    assert sorted(replies) == engines and not failures
    for e in engines:
        assert buffers_got(sim, e) == buffers


def test_plan_is_a_breadth_first_tree_and_a_chain_at_fanout_one():
    hosts = list("abcdefg")
    assert plan(hosts, 1) == {
        None: ["a"],
        "a": ["b"],
        "b": ["c"],
        "c": ["d"],
        "d": ["e"],
        "e": ["f"],
        "f": ["g"],
        "g": [],
    }
    tree = plan(hosts, 2)
    assert tree[None] == ["a", "b"] and tree["a"] == ["c", "d"] and tree["b"] == ["e", "f"] and tree["c"] == ["g"]
    fed = [h for feeds in tree.values() for h in feeds]
    assert sorted(fed) == hosts  # every host fed exactly once


def test_a_host_relay_that_hangs_mid_chain_is_healed_around_and_no_engine_gets_a_chunk_twice():
    sim, engines = bed(n_hosts=4, fanout=1)
    second = ("h", "h1")
    sim.down_nodes[second] = "hung"  # it takes nothing in and sends nothing on
    big = data(8_000)
    sim.request(engines, inner=big_inner(sim, big))
    assert sim.client_inbox == []  # the hosts after it wait for their chunks
    leaf = sim.nodes[()]
    step = leaf.ping_interval
    for _ in range(int(leaf.node_timeout / step) + 2):
        sim.tick(step)
    replies, failures, _ = sim.outcomes()
    assert sorted(failures) == [2, 3] and sorted(replies) == [0, 1, 4, 5, 6, 7]
    assert all("Host relay h1 has not answered" in f[2] for f in failures.values())
    for e in replies:
        assert len(sim.engine_inbox[e]) == 1 and buffers_got(sim, e) == [big]
    assert not any(n.pending for k, n in sim.nodes.items() if k != second)
    assert sim.closed_links == [second]  # what was queued for it goes


def test_hosts_whose_chunks_stop_coming_fail_their_engines_naming_the_cause():
    sim, engines = bed(n_hosts=2, fanout=1)
    head = sim.nodes[("h", "h0")]
    original = head.on_chunk
    head.on_chunk = lambda frames: []  # the head takes its chunks and forwards none
    sim.request(engines, inner=big_inner(sim, data(5_000)))
    head.on_chunk = original
    for _ in range(int(2 * head.node_timeout / head.ping_interval) + 2):
        sim.tick(head.ping_interval)
    replies, failures, _ = sim.outcomes()
    assert sorted(failures) == [0, 1, 2, 3] and not replies
    assert all("did not get the request's data: 0 of 5 chunks came" in f[2] for f in failures.values())
    assert sim.pending_total() == 0


# ------------------------------------------------------ one host relay's PushIn
def receiver(codec, store=None):
    clock = [0.0]
    into = dict(reserve=store.reserve, discard=store.drop) if store is not None else {}
    return PushIn(codec, lambda: clock[0], stall=10.0, **into), clock


class _P:
    def __init__(self, key):
        self.key = key


def chunk_message(codec, bulk_id, i, payload, digest=None):
    import hashlib

    d = digest or hashlib.sha256(payload).hexdigest()
    return [b"feeder"] + codec.pack(CHUNK_MSG, dict(id=bulk_id, i=i, d=d), [payload])


def test_chunks_that_come_before_their_envelope_wait_for_it_and_go_on():
    codec = P.Codec(Session(key=b"k"))
    bulk, _ = receiver(codec)
    sends, done = bulk.on_chunk(chunk_message(codec, "b1", 1, b"5678"))
    assert sends == [] and done is None and bulk.early_bytes == 4
    content = dict(bufs=[[0, 8]], chunk=4, id="b1", to=[["h9", "tcp://10.0.0.9:1"]])
    inc, sends = bulk.expect(_P("r1"), content, 1)
    assert len(sends) == 1 and bulk.early_bytes == 0  # forwarded to the host it feeds
    sends, done = bulk.on_chunk(chunk_message(codec, "b1", 0, b"1234"))
    assert done is inc and bytes(inc.buffers[0]) == b"12345678" and len(sends) == 1
    sends, done = bulk.on_chunk(chunk_message(codec, "b1", 0, b"1234"))  # again (healing): dropped
    assert sends == [] and bulk.duplicates == 1


@pytest.mark.parametrize("forge", ["digest", "signature", "index", "size"])
def test_forged_or_malformed_chunks_are_refused(forge):
    codec = P.Codec(Session(key=b"k"))
    bulk, _ = receiver(codec)
    bulk.expect(_P("r1"), dict(bufs=[[0, 8]], chunk=4, id="b1", to=[]), 1)
    if forge == "digest":
        frames = chunk_message(codec, "b1", 0, b"1234", digest="0" * 64)
    elif forge == "signature":
        frames = chunk_message(codec, "b1", 0, b"1234")
        frames[2] = b"f" * len(frames[2])
    elif forge == "index":
        frames = chunk_message(codec, "b1", 7, b"1234")
    else:
        frames = chunk_message(codec, "b1", 0, b"123")
    with pytest.raises(P.ProtocolError):
        bulk.on_chunk(frames)
    assert not bulk.incoming["b1"].have


@pytest.mark.parametrize(
    "layout",
    [
        dict(bufs=[[3, 8]], chunk=4),
        dict(bufs=[[0, 8]], chunk=0),
        dict(bufs=[], chunk=4),
        dict(bufs=[[0, 8], [0, 8]], chunk=4),
        dict(bufs=[[0, 1 << 40]], chunk=1),
        dict(bufs="x", chunk=4),
    ],
)
def test_bad_layouts_are_refused(layout):
    with pytest.raises(P.ProtocolError):
        Layout.from_content(layout, 1)


def test_a_malformed_chunk_is_dropped_by_the_node_not_raised():
    sim, engines = bed(n_hosts=1)
    node = sim.nodes[("h", "h0")]
    assert node.on_chunk([b"feeder", b"junk"]) == [] and node.dropped == 1


def test_chunks_are_written_into_a_segment_and_one_never_completed_is_unlinked(tmp_path):
    from ipyparallel_broadcast.host.shm import ShmStore

    codec = P.Codec(Session(key=b"k"))
    bulk, clock = receiver(codec, ShmStore(root=str(tmp_path)))
    inc, _ = bulk.expect(_P("r1"), dict(bufs=[[0, 8]], chunk=4, id="b1", to=[]), 1)
    (name,) = [p.name for p in tmp_path.iterdir()]
    assert inc.ref.name == name
    bulk.on_chunk(chunk_message(codec, "b1", 1, b"5678"))
    ((_, offset, _),) = inc.ref.bufs
    assert (tmp_path / name).read_bytes()[offset + 4 : offset + 8] == b"5678"  # in place, no copy of its own
    clock[0] = 11.0
    assert bulk.stalled(clock[0]) == [inc]
    assert list(tmp_path.iterdir()) == []


def test_the_plan_is_a_chain_for_few_hosts_and_two_trees_for_many():
    from ipyparallel_broadcast.relay.dataplane.pushplan import plan_push

    assert plan_push(8, 64 << 20).shape == "chain"
    assert plan_push(1, 1 << 20).shape == "chain"
    assert plan_push(1000, 1 << 30).shape == "two trees"
    assert plan_push(1000, 64 << 20, fanout=3) == plan_push(1000, 64 << 20, fanout=3, chunk=0)
    assert plan_push(1000, 64 << 20, fanout=3).shape == "tree"


def test_the_tree_shows_where_the_last_big_requests_chunks_went():
    from ipyparallel_broadcast.client.treeinfo import chunk_path

    sim, engines = bed(n_hosts=3, fanout=1)
    sim.request(engines, inner=big_inner(sim, data(3_000)))
    last = sim.nodes[()].stats()["bulk_last"]
    assert chunk_path("root", last) == "chunks of the last big request (3 of 1000 B): root -> h0 -> h1 -> h2"
    assert chunk_path("0", dict(last, fanout=2)).startswith("chunks of the last big request (3 of 1000 B): 0 -> a 2")
    two = dict(last, shape="two trees", chunk=256 << 10)
    assert chunk_path("0", two).startswith("chunks of the last big request (3 of 256 KiB): 0 -> two binary trees")


def test_a_segment_whose_request_was_done_before_its_chunks_came_is_unlinked_when_they_have(tmp_path):
    from ipyparallel_broadcast.host.shm import ShmStore

    codec = P.Codec(Session(key=b"k"))
    bulk, _ = receiver(codec, ShmStore(root=str(tmp_path)))
    content = dict(bufs=[[0, 8]], chunk=4, id="b1", to=[["h9", "tcp://10.0.0.9:1"]])
    inc, _ = bulk.expect(_P("r1"), content, 1)
    bulk.release(_P("r1"))  # every engine here failed first; the chunks still go on to h9
    bulk.on_chunk(chunk_message(codec, "b1", 0, b"1234"))
    sends, done = bulk.on_chunk(chunk_message(codec, "b1", 1, b"5678"))
    assert done is None and len(sends) == 1
    assert list(tmp_path.iterdir()) == [] and inc.ref is None
