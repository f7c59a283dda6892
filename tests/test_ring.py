"""An allreduce's big values round a ring of host relays (``relay.dataplane.ring``), in the pure core.

Each host's value is cut into parts; each part goes round the ring as a
reduce chain, then its final bytes go round again, written over each host's
own. No value goes to the leaf: every host ends with the whole value, and its
engines bind it at the root's word.
"""

import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_collectives_core import Engines, reduce_outcome
from test_upchain import CHUNK, DTYPES, SHAPES, bed

from ipyparallel_broadcast.relay.dataplane import push as bulk
from ipyparallel_broadcast.relay.dataplane import ring
from ipyparallel_broadcast.relay.events import UP
from ipyparallel_broadcast.wire import protocol as P
from ipyparallel_broadcast.wire.reduction import ReduceError, ufunc
from ipyparallel_broadcast.wire.topology import host_ident

pytestmark = pytest.mark.pure


def hosts_of(sim):
    return [node for node in sim.nodes.values() if node.host]


def ring_value(values, n_hosts, per_host, op):
    """What the ring gives: each host's engines in id order; part k of the
    value is host k's, then host k-1's, ..., round to host k+1's."""
    u = ufunc(op)
    host = [functools.reduce(u, [values[e] for e in range(h * per_host, (h + 1) * per_host)]) for h in range(n_hosts)]
    nbytes = host[0].nbytes
    cut = [c // host[0].itemsize for c in ring.cuts(nbytes, CHUNK, n_hosts)]
    out = np.empty_like(host[0])
    for k in range(n_hosts):
        order = [(k - j) % n_hosts for j in range(n_hosts)]  # k, k-1, ..., k+1
        part = [host[h][cut[k] : cut[k + 1]] for h in order]
        out[cut[k] : cut[k + 1]] = functools.reduce(lambda acc, v: u(v, acc), part[::-1])
    return out


class ValuesToLeaf:
    """Counts chunks of values that hosts sent the leaf through a chain."""

    def __init__(self, sim):
        self.chunks = 0
        for node in hosts_of(sim):
            run = node.big.chains._message

            def counted(link, content, data=b"", run=run):
                sends = run(link, content, data)
                self.chunks += sum(s.socket == UP for s in sends) if content.get("n") else 0
                return sends

            node.big.chains._message = counted


def bound_values(engines, name="total"):
    return {e: v for e, [(n, v, _)] in engines.bound.items() if n == name}


def clean(sim):
    assert sim.pending_total() == 0
    for node in hosts_of(sim):
        assert not node.big.rings.rings and not node.big.rings.results and not node.big.chains.links


@settings(max_examples=30, deadline=None)
@given(*SHAPES, DTYPES, st.integers(5 * CHUNK, 12 * CHUNK))
def test_every_engine_binds_the_value_the_ring_combined_and_no_value_reaches_the_leaf(n_hosts, per_host, op, dtype, n):
    sim, engines_ = bed(n_hosts, per_host)
    values = {e: ((np.arange(n) % 13 + e) % 7 + 1).astype(dtype) for e in engines_}
    engines = Engines(values)
    sim.answer_with = engines
    to_leaf = ValuesToLeaf(sim)
    msg_id = sim.request(engines_, reduce=op, allreduce="total")
    expected = ring_value(values, n_hosts, per_host, op)
    np.testing.assert_array_equal(expected, functools.reduce(ufunc(op), [values[e] for e in engines_]))
    bound = bound_values(engines)
    assert sorted(bound) == engines_ and all(v.tobytes() == expected.tobytes() for v in bound.values())
    assert all(parent == msg_id for [(_, _, parent)] in engines.bound.values())
    r, raised, failed = reduce_outcome(sim)
    assert r.result() == len(engines_) and not raised and not failed
    assert to_leaf.chunks == 0  # no chain to the leaf: the value stayed in the hosts
    chunks = -(-expected.nbytes // CHUNK)
    assert all(node.big.rings.gathered == chunks for node in hosts_of(sim))  # each host wrote each final chunk
    assert sum(node.big.rings.forwarded for node in hosts_of(sim)) == chunks * (n_hosts - 2)
    clean(sim)


def test_a_float_sum_round_the_ring_is_the_same_to_the_bit_whatever_order_engines_answer_in():
    results = set()
    for order in ([0, 1, 2, 3, 4, 5, 6, 7], [7, 6, 5, 4, 3, 2, 1, 0], [5, 0, 7, 2, 6, 1, 4, 3]):
        sim, engines_ = bed(4, 2)
        rng = np.random.default_rng(7)
        values = {e: rng.standard_normal(3000) * 10.0 ** rng.integers(-8, 8) for e in engines_}
        engines = Engines(values)
        sim.answer_with = engines
        sim.request_answered_in(order, engines_, reduce="sum", allreduce="total")
        bound = bound_values(engines)
        assert len({v.tobytes() for v in bound.values()}) == 1
        assert bound[0].tobytes() == ring_value(values, 4, 2, "sum").tobytes()
        results.add(bound[0].tobytes())
    assert len(results) == 1


def test_small_values_do_not_go_round_and_bind_as_before():
    sim, engines_ = bed(3, 2)
    engines = Engines({e: e + 1 for e in engines_})
    sim.answer_with = engines
    sim.request(engines_, reduce="sum", allreduce="total")
    assert bound_values(engines) == {e: sum(e + 1 for e in engines_) for e in engines_}
    assert all(node.big.rings.gathered == 0 for node in hosts_of(sim))
    clean(sim)


def test_a_reduce_does_not_ring_and_an_allreduce_with_engines_beside_the_hosts_does_not_either():
    sim, engines_ = bed(3, 2, direct=[0, 1])
    values = {e: np.arange(4000.0) + e for e in engines_}
    engines = Engines(values)
    sim.answer_with = engines
    sim.request(engines_, reduce="sum", allreduce="total")
    expected = functools.reduce(np.add, [values[e] for e in engines_])
    assert all(np.array_equal(v, expected) for v in bound_values(engines).values())
    assert all(node.big.rings.gathered == 0 for node in hosts_of(sim))  # a chain took it
    clean(sim)


def test_an_engine_that_raised_binds_nothing_and_the_hosts_let_their_values_go():
    sim, engines_ = bed(3, 2)
    engines = Engines({e: np.arange(4000.0) + e for e in engines_}, raises=[3])
    sim.answer_with = engines
    sim.request(engines_, reduce="sum", allreduce="total")
    r, raised, failed = reduce_outcome(sim)
    assert not engines.bound and len(raised) == 1
    assert any(node.big.rings.results for node in hosts_of(sim))  # the ring went round; no bind came
    sim.tick(hosts_of(sim)[0].big.rings.stall + 1)
    clean(sim)


def test_a_host_whose_engines_all_raised_ends_the_ring_and_nothing_binds():
    sim, engines_ = bed(4, 2)
    engines = Engines({e: np.arange(4000.0) + e for e in engines_}, raises=[2, 3])  # all of h1
    sim.answer_with = engines
    sim.request(engines_, reduce="sum", allreduce="total")
    r, raised, failed = reduce_outcome(sim)
    assert not engines.bound and len(raised) == 2 and not failed
    with pytest.raises(ReduceError, match="allreduce: the ring of hosts ended: host h1 gave it no value"):
        r.result()
    clean(sim)


def test_hosts_whose_values_do_not_combine_bind_nothing():
    sim, engines_ = bed(3, 2)
    engines = Engines({e: np.arange(4000.0 if e < 4 else 5000.0) for e in engines_})  # h2's are longer
    sim.answer_with = engines
    sim.request(engines_, reduce="sum", allreduce="total")
    r, _, _ = reduce_outcome(sim)
    assert not engines.bound
    with pytest.raises(ReduceError, match="do not combine|gave it no value"):
        r.result()
    clean(sim)


def test_a_host_lost_mid_ring_fails_its_engines_by_name_the_others_let_go_and_nothing_binds():
    sim, engines_ = bed(4, 2)
    engines = Engines({e: np.arange(4000.0) + e for e in engines_})
    sim.answer_with = engines
    sim.hold.update([6, 7])  # h3's engines have not answered: the ring waits for its parts
    sim.request(engines_, reduce="sum", allreduce="total")
    assert not sim.client_inbox
    sim.down_nodes[("h", "h3")] = "dead"
    leaf = sim.nodes[()]
    sim._run(leaf, leaf.on_child_lost(next(k for k in leaf.children if isinstance(k, bytes) and b"h3" in k)), ())
    r, _, failed = reduce_outcome(sim)
    assert sorted(f[0] for f in failed) == [6, 7] and all("h3" in f[2] for f in failed)
    with pytest.raises(ReduceError, match="the ring of hosts ended: it lost a host: host relay h3"):
        r.result()
    assert not engines.bound
    for label in ("h0", "h1", "h2"):
        node = sim.nodes["h", label]
        assert not node.big.rings.rings and not node.big.rings.results and not node.big.chains.links
    assert sim.nodes[()].pending == {}


def test_a_bind_for_a_value_a_host_does_not_hold_fails_its_engines_by_name():
    sim, engines_ = bed(2, 2)
    host = sim.nodes["h", "h0"]
    content = P.request_content("m-1", [0, 1], P.COALESCE, req="r-x", reduce="sum", ring_bind="total")
    inner = sim.session.serialize(sim.session.msg("apply_request", content={}))[1:]
    sends = host.on_up(sim.codec.pack(P.REQUEST, content, inner))
    (up,) = [s for s in sends if s.socket == UP]
    assert b"got no allreduce value" in b"".join(P.as_bytes(f) for f in up.frames)
    assert host.pending == {}


@pytest.mark.parametrize(
    "forge",
    [dict(k=0), dict(k=5), dict(i=9), dict(n=7), dict(k="1"), dict(key="r-other")],
)
def test_forged_or_malformed_ring_chunks_are_dropped(forge):
    sim, engines_ = bed(3, 1)
    host = sim.nodes["h", "h0"]
    host.big.rings.join("r-1", "m-1", "sum", dict(urls=["u0", "u1", "u2"], at=0))
    value = np.zeros(3 * CHUNK // 8)
    host.big.rings.own_value("r-1", dict(t="nd", dtype="<f8", shape=[value.size], scalar=False), value.data)
    data = b"\1" * CHUNK
    content = dict(dict(key="r-1", k=1, i=0, n=1), **forge)
    content["d"] = bulk.digest(data)
    body = sim.codec.pack(ring.RGATHER, content, [data])
    dropped = host.dropped
    assert host.on_chunk([b"u0", host_ident("chain")] + body) == []
    assert host.dropped == dropped + 1 and value.sum() == 0  # nothing written


def test_a_ring_chunk_with_a_wrong_digest_is_dropped():
    sim, engines_ = bed(3, 1)
    host = sim.nodes["h", "h0"]
    host.big.rings.join("r-1", "m-1", "sum", dict(urls=["u0", "u1", "u2"], at=0))
    value = np.zeros(3 * CHUNK // 8)
    host.big.rings.own_value("r-1", dict(t="nd", dtype="<f8", shape=[value.size], scalar=False), value.data)
    body = sim.codec.pack(ring.RGATHER, dict(key="r-1", k=1, i=0, n=1, d=bulk.digest(b"x")), [b"\1" * CHUNK])
    host.on_chunk([b"u0", host_ident("chain")] + body)
    assert host.dropped == 1 and value.sum() == 0


@pytest.mark.parametrize("content", [5, dict(urls=["a"], at=0), dict(urls=["a", "b"], at=2), dict(urls="ab")])
def test_a_request_with_a_malformed_ring_place_is_dropped_and_leaves_no_state(content):
    sim, engines_ = bed(2, 1)
    host = sim.nodes["h", "h0"]
    body = dict(P.request_content("m-1", [0], P.COALESCE, req="r-y", reduce="sum"), ring=content)
    inner = sim.session.serialize(sim.session.msg("apply_request", content={}))[1:]
    host.on_up(sim.codec.pack(P.REQUEST, body, inner))
    assert host.dropped == 1 and host.pending == {} and not host.big.rings.rings and not host.big.chains.links


def test_parts_fall_on_chunk_boundaries_and_cover_the_value():
    for nbytes, n in [(3 * CHUNK, 3), (10 * CHUNK + 5, 4), (64 * CHUNK, 8)]:
        c = ring.cuts(nbytes, CHUNK, n)
        assert c[0] == 0 and c[-1] == nbytes and all(b > a for a, b in zip(c, c[1:]))
        assert all(x % CHUNK == 0 for x in c[:-1])
    assert ring.takes_part(3 * CHUNK, CHUNK, 3) and not ring.takes_part(3 * CHUNK - 1, CHUNK, 3)


def test_a_host_combines_its_parts_in_the_order_the_ring_needs_them():
    sim, _ = bed(4, 1)
    rings = sim.nodes["h", "h0"].big.rings
    rings.join("r-1", "m-1", "sum", dict(urls=["u0", "u1", "u2", "u3"], at=1))
    value = np.zeros(8 * CHUNK // 8)
    assert rings.own_begin("r-1", dict(t="nd", dtype="<f8", shape=[value.size], scalar=False), value.data)
    c = ring.cuts(value.nbytes, CHUNK, 4)
    # the part it starts (0, the host before it is its head's ...), then each as it comes round; its own (1) last
    assert rings.order("r-1") == [(c[0], c[1]), (c[3], c[4]), (c[2], c[3]), (c[1], c[2])]


def test_a_host_whose_value_comes_after_the_leaf_ended_its_ring_sends_an_error_not_its_value():
    sim, engines_ = bed(4, 2)
    engines = Engines({e: np.arange(4000.0) + e for e in engines_}, raises=[2, 3])  # all of h1
    sim.answer_with = engines
    sim.hold.update([6, 7])  # h3's engines answer after the leaf ended the ring
    leaf, into_leaf = sim.nodes[()], []
    on_down = leaf.on_down

    def counted(frames):
        into_leaf.append(sum(len(P.as_bytes(f)) for f in frames))
        return on_down(frames)

    leaf.on_down = counted
    sim.request(engines_, reduce="sum", allreduce="total")
    assert sim.nodes["h", "h3"].big.rings.ended  # told before its engines answered
    sim.release(6)
    sim.release(7)
    r, raised, _ = reduce_outcome(sim)
    with pytest.raises(ReduceError, match="gave it no value"):
        r.result()
    assert not engines.bound and max(into_leaf) < 4000 * 8  # no host's value came to the leaf
    clean(sim)
