"""A reduce's big values across hosts in a pipelined chain (``relay.dataplane.chains``), in the pure core.

Host relays send their hosts' combined values host to host in chunks, each
adding its own; only the chain's head sends to the leaf. The leaf's link
carries one value, whatever the number of hosts.
"""

import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ipyparallel.serialize import serialize_object
from treesim import TreeSim

from ipyparallel_broadcast.relay.dataplane import chains as upchain
from ipyparallel_broadcast.relay.dataplane import plans
from ipyparallel_broadcast.relay.dataplane import reduce_trees as uplinks
from ipyparallel_broadcast.relay.events import UP
from ipyparallel_broadcast.wire import bundles as B
from ipyparallel_broadcast.wire import protocol as P
from ipyparallel_broadcast.wire.reduction import OPS, ReduceError, Reduction, engine_value, ufunc

pytestmark = pytest.mark.pure

CHUNK = 1024  # bytes: small, so that values have many chunks


def bed(n_hosts=4, per_host=2, direct=(), depth=0, shape="chain"):
    """Hosts h0.. each with ``per_host`` engines under leaf 0, and ``direct``
    engines on the leaf; big values go to the leaf by ``shape`` (``uplinks``)."""
    first = len(direct)
    hosts = {f"h{i}": (0, list(range(first + i * per_host, first + (i + 1) * per_host))) for i in range(n_hosts)}
    engines = list(direct) + list(range(first, first + n_hosts * per_host))
    sim = TreeSim(depth, 2, engines, hosts=hosts, bulk=dict(chunk=CHUNK, threshold=CHUNK, reduce=shape))
    return sim, engines


def answering(values, raises=()):
    def answer(eid, request):
        if eid in raises:
            return {"status": "error", "ename": "ValueError", "evalue": "no", "traceback": []}, []
        return {"status": "ok"}, serialize_object(engine_value(lambda: values[eid]))

    return answer


def outcome(sim):
    (frames,) = sim.client_inbox
    state, value, raised, failed = B.reduced_parts(sim.codec.unpack(P.split_idents(frames)[1]))
    r = Reduction(state["op"])
    r.add_partial(state, value)
    return r, raised, failed


class Links:
    """Counts the chain messages each link carried (host -> host, head -> leaf)."""

    def __init__(self, sim):
        self.to_leaf = 0
        for node in sim.nodes.values():
            if node.host:
                run = node.big.chains._message

                def counted(link, content, data=b"", run=run):
                    sends = run(link, content, data)
                    self.to_leaf += sum(s.socket == UP for s in sends)
                    return sends

                node.big.chains._message = counted


def big(eid, n=2000, dtype=float):
    return (np.arange(n) % 17 + eid).astype(dtype)


# hosts, engines per host, op, dtype: what a reduce across hosts is tried with (here and in ``test_ring``)
SHAPES = (st.integers(2, 5), st.integers(1, 3), st.sampled_from(sorted(OPS)))
DTYPES = st.sampled_from(["float64", "int32", "uint8", "complex128"])
WAYS = pytest.mark.parametrize("shape", ["chain", "two trees"])


def exact(eid, n=2000, dtype=float):
    """A big value whose combination with up to 18 others is exact in any order
    (a product stays below 2**53 in float64): the way's order, which is not
    the engines' (floats do not associate), gives the very same bits."""
    return ((np.arange(n) % 17 + eid) % 7 + 1).astype(dtype)


def reduced(shape, n_hosts, per_host, op, dtype, n):
    """A reduce of big values by ``shape``, checked against combining every
    engine's: the sim, the value's chunks, and the chain messages counted."""
    sim, engines = bed(n_hosts, per_host, shape=shape)
    values = {e: exact(e, n, dtype) for e in engines}
    sim.answer_with = answering(values)
    links = Links(sim)
    sim.request(engines, reduce=op)
    r, raised, failed = outcome(sim)
    expected = functools.reduce(ufunc(op), [values[e] for e in engines])
    np.testing.assert_array_equal(r.result(), expected)
    assert sorted(r.eids) == engines and not raised and not failed
    assert all(not node.big.chains.links for node in sim.nodes.values())
    assert sim.pending_total() == 0
    return sim, -(-expected.nbytes // CHUNK), links


@settings(max_examples=40, deadline=None)
@given(*SHAPES, DTYPES, st.integers(300, 3000))
def test_the_chain_gives_the_same_value_as_combining_every_engines(n_hosts, per_host, op, dtype, n):
    _, chunks, links = reduced("chain", n_hosts, per_host, op, dtype, n)
    assert links.to_leaf == chunks  # the head alone sent to the leaf: one value's chunks


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 9), st.integers(1, 2), st.sampled_from(sorted(OPS)), DTYPES, st.integers(2100, 4000))
def test_two_trees_give_the_same_value_and_each_hosts_link_carries_about_one_value(n_hosts, per_host, op, dtype, n):
    sim, chunks, links = reduced("two trees", n_hosts, per_host, op, dtype, n)
    assert sim.nodes[()].big.reduce_chains.shape == "two trees"
    assert links.to_leaf == chunks  # the two heads' halves: one value into the leaf
    hosts = [node for node in sim.nodes.values() if node.host]
    assert all(node.big.chains.sent == chunks for node in hosts)  # each host sends each half once: one value
    assert all(node.big.chains.received <= chunks + 1 for node in hosts)  # and gets at most two halves of one tree


@pytest.mark.parametrize("n_hosts", range(2, 70))
def test_in_two_trees_no_host_combines_for_both_and_a_half_climbs_log2_hosts(n_hosts):
    hosts = [(f"h{i}".encode(), f"tcp://h{i}", 10 * i) for i in range(n_hosts)]
    order, heads, contents = plans.reduce_way(hosts, plans.TWO_TREES)
    assert order == [h[0] for h in hosts] and heads == [hosts[0][0], hosts[-1][0]]
    by_url = {h[1]: h[0] for h in hosts}
    for t in range(2):
        parents = {h: by_url.get(contents[h]["parts"][t]["to"]) for h in order}
        feeds = {h: sum(parent == h for parent in parents.values()) for h in order}
        assert all(contents[h]["parts"][t]["feeds"] == feeds[h] <= 2 for h in order)
        slots = [(parents[h], contents[h]["parts"][t]["slot"]) for h in order if parents[h] is not None]
        assert len(set(slots)) == len(slots)  # each feeder has its own slot
        for h in order:  # every host reaches the head in at most ceil(log2 P) hops
            hops, at = 0, h
            while parents[at] is not None:
                at, hops = parents[at], hops + 1
            assert at == heads[t] and hops <= max(1, (n_hosts - 1).bit_length())
    interior = [{h for h in order if contents[h]["parts"][t]["feeds"]} for t in range(2)]
    assert not interior[0] & interior[1]


def test_the_model_takes_a_chain_for_a_few_hosts_and_two_trees_for_many():
    assert uplinks.choose(4) == uplinks.choose(8) == uplinks.choose(16) == uplinks.CHAIN  # (as measured on the bed)
    assert uplinks.choose(100) == uplinks.choose(1000) == uplinks.TWO_TREES
    assert uplinks.choose(1000, "chain") == uplinks.CHAIN


def test_a_value_of_one_chunk_goes_whole_up_one_tree():
    sim, engines = bed(5, 1, shape="two trees")
    values = {e: np.full(CHUNK, e, dtype="uint8") for e in engines}
    sim.answer_with = answering(values)
    sim.request(engines, reduce="max")
    r, raised, failed = outcome(sim)
    np.testing.assert_array_equal(r.result(), values[max(engines)])
    assert sim.pending_total() == 0 and all(not node.big.chains.links for node in sim.nodes.values())


def test_in_two_trees_a_host_that_waits_holds_at_most_a_window_of_each_feeders_chunks():
    sim, engines = bed(7, 1, shape="two trees")
    values = {e: big(e, n=8000) for e in engines}  # 63 chunks: 32 in the first half
    sim.answer_with = answering(values)
    sim.hold.add(0)  # h0 (the first tree's head) waits for its engine; h1 and h2 feed it
    sim.request(engines, reduce="sum")
    (key,) = sim.nodes[()].pending
    link = sim.nodes[("h", "h0")].big.chains.links[uplinks.part_key(key, 0)]
    held = [sum(slot in got for got in link.chunks.values()) for slot in (0, 1)]
    assert held == [plans.WINDOW] * 2  # not the 32 each could have sent
    sim.release(0)
    r, raised, failed = outcome(sim)
    np.testing.assert_array_equal(r.result(), sum(values[e] for e in engines))
    assert all(not node.big.chains.links for node in sim.nodes.values()) and sim.pending_total() == 0


@pytest.mark.parametrize("upto", ["9", None, 1.5])
def test_a_malformed_or_stray_chain_credit_is_dropped_or_let_be(upto):
    sim, engines = bed(3, 1, shape="two trees")
    host = sim.nodes[("h", "h1")]
    frames = [b"feeder"] + sim.codec.pack(upchain.RCREDIT, dict(key="r1#0", upto=upto), [])
    assert host.on_chunk(frames) == [] and host.dropped == 1
    stray = [b"feeder"] + sim.codec.pack(upchain.RCREDIT, dict(key="r1#0", upto=9), [])
    assert host.on_chunk(stray) == [] and host.dropped == 1  # (credit for a link done or gone: let be)


@WAYS
def test_a_float_sum_through_the_chain_is_the_same_whatever_order_hosts_finish_in(shape):
    sim, engines = bed(4, 2, shape=shape)
    values = {e: np.array([1e16, 1.0, -1e16, 3.3e-3, 7e15, 2.5, -7e15, 1e-9][e % 8] * np.ones(600)) for e in engines}
    results = set()
    for order in (engines, engines[::-1], [5, 0, 7, 2, 6, 1, 4, 3]):
        sim, _ = bed(4, 2, shape=shape)
        sim.answer_with = answering(values)
        sim.request_answered_in(order, engines, reduce="sum")
        r, _, _ = outcome(sim)
        results.add(r.result().tobytes())
    assert len(results) == 1


@WAYS
def test_small_values_stay_in_the_bundles_and_the_leaf_does_not_wait_for_the_chain(shape):
    sim, engines = bed(3, 2, shape=shape)
    sim.answer_with = answering({e: e for e in engines})  # Python numbers: small
    links = Links(sim)
    sim.request(engines, reduce="sum")
    r, _, _ = outcome(sim)
    assert r.result() == sum(engines)
    assert links.to_leaf == (1 if shape == "chain" else 2)  # each head's "no value", after the call was done
    assert sim.nodes[()].dropped == 0 and sim.pending_total() == 0


@WAYS
def test_direct_engines_and_a_chain_combine_at_the_leaf(shape):
    sim, engines = bed(3, 2, direct=[0, 1], shape=shape)
    values = {e: big(e) for e in engines}
    sim.answer_with = answering(values)
    sim.request(engines, reduce="max")
    r, _, _ = outcome(sim)
    np.testing.assert_array_equal(r.result(), functools.reduce(np.maximum, values.values()))


@WAYS
def test_engines_that_raise_are_named_and_the_rest_of_the_chain_combines(shape):
    sim, engines = bed(4, 2, shape=shape)
    values = {e: big(e) for e in engines}
    sim.answer_with = answering(values, raises={2, 3, 6})  # all of host h1, one of h3
    sim.request(engines, reduce="sum")
    r, raised, failed = outcome(sim)
    np.testing.assert_array_equal(r.result(), sum(values[e] for e in engines if e not in (2, 3, 6)))
    assert len(raised) == 3 and not failed


@WAYS
def test_hosts_whose_values_do_not_combine_raise_reduce_error(shape):
    sim, engines = bed(3, 2, shape=shape)
    values = {e: big(e, n=2000 if e < 4 else 3000) for e in engines}  # the last host's are longer
    sim.answer_with = answering(values)
    sim.request(engines, reduce="sum")
    r, _, _ = outcome(sim)
    with pytest.raises(ReduceError, match="do not combine"):
        r.result()
    assert sim.pending_total() == 0


@WAYS
def test_a_host_lost_mid_chain_fails_the_chained_engines_by_name_and_nothing_hangs(shape):
    sim, engines = bed(4, 2, shape=shape)
    values = {e: big(e) for e in engines}
    sim.answer_with = answering(values)
    sim.hold.update([6, 7])  # the tail (h3) waits for its engines
    sim.request(engines, reduce="sum")
    assert not sim.client_inbox  # hosts h0-h2 chained their values and wait for h3's
    sim.down_nodes[("h", "h3")] = "dead"
    leaf = sim.nodes[()]
    sim._run(leaf, leaf.on_child_lost(next(k for k in leaf.children if isinstance(k, bytes) and b"h3" in k)), ())
    r, _, failed = outcome(sim)
    assert sorted(f[0] for f in failed) == engines  # h3's died with it; the others' values went with the chain
    assert all("h3" in f[2] for f in failed)
    with pytest.raises(ReduceError):
        r.result()
    assert sim.nodes[()].pending == {}
    assert all(not sim.nodes[("h", h)].big.chains.links for h in ("h0", "h1", "h2"))  # told: they let go


@WAYS
def test_hosts_whose_engines_compute_longer_than_the_chains_stall_time_still_chain(shape):
    sim, engines = bed(4, 2, shape=shape)
    values = {e: big(e) for e in engines}
    sim.answer_with = answering(values)
    sim.hold.update([6, 7])  # the tail's engines compute for three stall times; the other hosts wait
    sim.request(engines, reduce="sum")
    for _ in range(int(6 * sim.nodes[()].big.chains.stall)):
        sim.tick(0.5)  # (pings and pongs go on)
    assert not sim.client_inbox
    sim.release(6)
    sim.release(7)
    r, raised, failed = outcome(sim)
    assert not raised and not failed
    np.testing.assert_array_equal(r.result(), sum(values[e] for e in engines))
    assert sim.nodes[()].dropped == 0 and sim.pending_total() == 0


@WAYS
def test_a_chain_that_stops_fails_once_every_host_has_answered(shape):
    sim, engines = bed(3, 2, shape=shape)
    values = {e: big(e) for e in engines}
    sim.answer_with = answering(values)
    head = sim.nodes[("h", "h0")]
    head.big.chains.on_message = lambda msg, data: []  # h1's chunks never get through to the head
    sim.request(engines, reduce="sum")
    assert not sim.client_inbox
    sim.tick(sim.nodes[()].big.chains.stall + 1)
    r, _, failed = outcome(sim)
    assert sorted(f[0] for f in failed) == engines and all("nothing came" in f[2] for f in failed)
    assert sim.pending_total() == 0
    assert all(not node.big.chains.links for node in sim.nodes.values())  # the leaf told every host


@pytest.mark.parametrize(
    "forge",
    [
        dict(n=-1),
        dict(n=2, v=dict(nbytes=10, chunk=1024), i=0),  # 10 bytes in 2 chunks
        dict(n=1, v=dict(nbytes=1 << 50, chunk=1 << 50), i=0),  # too big
        dict(n=1, v=dict(nbytes=8, chunk=1024), i=1),
        dict(n=1, v=dict(nbytes=9, chunk=1024), i=0),  # 9 bytes said, 8 sent
        dict(n=1, v="x", i=0),
    ],
)
def test_forged_or_malformed_chain_messages_are_dropped(forge):
    sim, engines = bed(2, 1)
    host = sim.nodes[("h", "h0")]
    content = dict(dict(key="r1", i=0, n=1, v=dict(nbytes=8, chunk=1024)), **forge)
    content["d"] = upchain.digest(b"\0" * 8)
    frames = [b"feeder", P._DELIM] + sim.codec.pack(upchain.RCHUNK, content, [b"\0" * 8])
    assert host.on_chunk(frames) == [] and host.dropped == 1
    bad_digest = [b"feeder", P._DELIM] + sim.codec.pack(upchain.RCHUNK, dict(key="r1", i=0, n=0, d="0" * 64), [b""])
    assert host.on_chunk(bad_digest) == [] and host.dropped == 2


@WAYS
def test_a_chain_message_from_a_host_that_is_not_the_head_is_dropped(shape):
    sim, engines = bed(3, 2, shape=shape)
    values = {e: big(e) for e in engines}
    sim.answer_with = answering(values)
    sim.hold.update(engines)
    sim.request(engines, reduce="sum")
    leaf = sim.nodes[()]
    (key,) = leaf.pending
    tail = next(k for k in leaf.children if isinstance(k, bytes) and b"h2" in k)
    data = b"\0" * 8
    part = uplinks.part_key(key, 0)  # (with two trees, h2 is the head of part 1, not of part 0)
    msg = sim.codec.pack(upchain.RCHUNK, dict(key=part, n=0, d=upchain.digest(data)), [data])
    leaf.on_down([tail] + msg)
    assert leaf.dropped == 1 and leaf.big.reduce_chains.of[key].outcome is None


@WAYS
def test_a_bundle_that_comes_after_the_chain_said_the_values_do_not_combine_gets_the_same_error(shape):
    """Bundles and the chain come on different links: either may come first."""
    sim, engines = bed(3, 2, shape=shape)
    sim.answer_with = answering({e: big(e, n=2000 if e < 4 else 3000) for e in engines})
    tail = sim.nodes[("h", "h2")]
    own, late = tail.big.reduce_chains.own, []

    def bundle_held(p):  # the tail's bundle is held back; its chain chunks go
        sends = own(p)
        late.extend(s for s in sends if s.socket == UP and b"ipb_rchunk" not in b"".join(map(P.as_bytes, s.frames)))
        return [s for s in sends if s not in late]

    tail.big.reduce_chains.own = bundle_held
    sim.request(engines, reduce="sum")
    leaf = sim.nodes[()]
    (p,) = leaf.pending.values()
    assert leaf.big.reduce_chains.of[p.key].outcome == "failed" and len(late) == 1
    ident = next(k for k in leaf.children if isinstance(k, bytes) and b"h2" in k)
    sim._run(leaf, leaf.on_down([ident] + late[0].frames), ())
    r, _, failed = outcome(sim)
    assert not failed  # no engine is said to have lost its value: they all gave one
    with pytest.raises(ReduceError, match="do not combine"):
        r.result()
    assert sorted(r.eids) == engines
