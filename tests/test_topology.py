"""The tree's shape, pure (``wire.topology``): leaves, paths and the split of targets down the
tree at any depth and fan-out, balanced ids, and the 'auto' shape's picks."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ipyparallel_broadcast.wire.topology import (
    ENGINE_MS,
    HOP_MS,
    TreeShape,
    auto_shape,
    balanced_id,
    modelled_ms,
    node_identity,
    node_name,
    render,
)

pytestmark = pytest.mark.pure

shapes = st.builds(TreeShape, depth=st.integers(0, 4), fanout=st.integers(2, 5))
engine_lists = st.lists(st.integers(0, 5000), unique=True, max_size=60)


@given(shapes)
def test_counts(shape):
    nodes = list(shape.nodes())
    assert len(nodes) == shape.n_nodes == len(set(nodes))
    leaves = [p for p in nodes if shape.is_leaf(p)]
    assert len(leaves) == shape.n_leaves
    assert sorted(shape.leaf_index(p) for p in leaves) == list(range(shape.n_leaves))
    for p in leaves:
        assert shape.leaf_path(shape.leaf_index(p)) == p


@given(shapes, engine_lists)
def test_split_partitions_in_order(shape, eids):
    for path in shape.nodes():
        if shape.is_leaf(path):
            continue
        mine = [e for e in eids if shape.serves(path, e)]
        parts = shape.split(path, mine)
        assert all(parts.values()), "no empty children"
        assert sorted(e for sub in parts.values() for e in sub) == sorted(mine)
        for digit, sub in parts.items():
            assert sub == [e for e in mine if shape.child_digit(path, e) == digit]
            assert all(shape.serves(path + (digit,), e) for e in sub)


@given(shapes, engine_lists)
def test_leaf_rule_matches_ipengine(shape, eids):
    """ipengine connects to broadcast[id % len(broadcast)]: the leaf we route to."""
    for eid in eids:
        leaf = shape.leaf_path(eid % shape.n_leaves)
        assert shape.serves(leaf, eid)
        assert shape.serves((), eid)
    layout = shape.layout(eids)
    assert sorted(e for es in layout.values() for e in es) == sorted(eids)


def test_single_and_empty():
    shape = TreeShape(2, 3)
    assert shape.split((), []) == {}
    assert shape.split((), [7]) == {shape.child_digit((), 7): [7]}
    assert shape.split((1,), [4]) == {1: [4]}  # 4 % 9 = 4 -> leaf (1, 1)


def test_names_and_render():
    shape = TreeShape(1, 2)
    assert node_name(()) == "root" and node_name((1, 0)) == "1.0"
    assert node_identity((1,)) == b"ipb-node:1"
    text = render(shape, [0, 1, 2, 3])
    assert "depth=1 fanout=2" in text and "engines [0, 2]" in text


def test_bad_shapes():
    import pytest

    with pytest.raises(ValueError):
        TreeShape(1, 1)
    with pytest.raises(ValueError):
        TreeShape(-1, 2)


@given(st.integers(0, 50), st.sets(st.integers(0, 60)), st.integers(1, 9))
def test_balanced_id_lands_on_a_least_loaded_leaf(next_id, live, n_leaves):
    live = {e for e in live if e < next_id}  # ids below the counter were handed out
    eid = balanced_id(next_id, live, n_leaves)
    load = [sum(1 for e in live if e % n_leaves == leaf) for leaf in range(n_leaves)]
    assert eid >= next_id and eid not in live
    assert load[eid % n_leaves] == min(load)
    assert eid < next_id + n_leaves  # no id is skipped needlessly


def test_balanced_ids_are_consecutive_while_engines_only_arrive():
    live = []
    for _ in range(20):
        live.append(balanced_id(len(live), live, 4))
    assert live == list(range(20))


def test_balanced_ids_refill_the_leaf_that_lost_engines():
    live = [1, 3]  # engines 0 and 2 (both on leaf 0 of 2) died
    first = balanced_id(4, live, 2)
    second = balanced_id(first + 1, live + [first], 2)
    assert (first, second) == (4, 6)


def test_auto_shape_worked_example():
    """64 engines, 16 cores (HOP_MS 1.7, ENGINE_MS 0.15), by hand: a flat tree
    takes 1.7 + 64 x 0.15 = 11.3 ms; depth 1 with fan-out f takes
    2 x 1.7 + (f + 64/f) x 0.15, least at f = 8: 5.8 ms; depth 2 at its best
    (f = 4) takes 3 x 1.7 + (2 x 4 + 4) x 0.15 = 6.9 ms. The 9 nodes' work,
    26.1 ms, spread on 15 cores is 1.74 ms and does not bind."""
    assert (HOP_MS, ENGINE_MS) == (1.7, 0.15)
    assert auto_shape(64, 16) == TreeShape(1, 8)
    assert modelled_ms(TreeShape(1, 8), 64, 16) == pytest.approx(5.8)
    assert modelled_ms(TreeShape(0, 2), 64, 16) == pytest.approx(11.3)
    assert modelled_ms(TreeShape(2, 4), 64, 16) == pytest.approx(6.9)


@given(st.integers(1, 20000), st.sampled_from([1, 2]))
def test_auto_shape_is_flat_with_one_core_for_the_nodes(n, cores):
    """All nodes share one core: any node beyond the root only adds work."""
    assert auto_shape(n, cores).depth == 0


@given(st.integers(1, 20000), st.integers(1, 128), st.integers(1, 64))
def test_auto_shape_fits_and_more_cores_never_model_slower(n, cores, more):
    shape = auto_shape(n, cores)
    assert shape.depth == 0 or shape.n_leaves <= n  # no leaf is left without engines
    best = modelled_ms(shape, n, cores)
    assert best <= modelled_ms(TreeShape(0, 2), n, cores)  # never worse than a flat tree
    assert modelled_ms(auto_shape(n, cores + more), n, cores + more) <= best


@given(st.integers(1, 5000), st.integers(1, 64), st.integers(0, 3), st.integers(2, 8))
def test_auto_shape_keeps_what_is_fixed(n, cores, depth, fanout):
    assert auto_shape(n, cores, depth=depth).depth == depth
    assert auto_shape(n, cores, fanout=fanout).fanout == fanout
    assert auto_shape(n, cores, depth, fanout) == TreeShape(depth, fanout)


def test_auto_shape_follows_the_engine_count_and_the_cores():
    assert auto_shape(1, 2).depth == auto_shape(16, 64).depth == 0  # few engines: the root alone
    assert auto_shape(1024, 2).depth == 0  # as the 2-core sweep measured: no core to spare for relays
    assert auto_shape(4096, 64).depth == 2  # many cores, many engines: a deeper tree
    assert auto_shape(256, 16).n_leaves > auto_shape(256, 2).n_leaves  # cores for more leaves


@pytest.mark.parametrize("hosts, host_fanout", [(1, 16), (16, 16), (1000, 16), (1000, 0)])
def test_auto_tree_serves_hosts_when_engines_are_behind_host_relays(hosts, host_fanout):
    """With engines on many hosts (one relay each, all under the first leaf),
    the leaf sends a call to at most ``host_fanout`` relays, which pass it on:
    'auto' sizes the tree for that many, not for the engines or every host."""
    from ipyparallel_broadcast.controller.app import BroadcastController
    from ipyparallel_broadcast.engine.compose.host import cpu_count

    controller = BroadcastController(depth="auto", fanout="auto", engines=4096, hosts=hosts, host_fanout=host_fanout)
    served = 4096 if hosts == 1 else min(hosts, host_fanout or hosts)
    assert controller.shape == auto_shape(served, cpu_count())
    assert controller.auto_inputs.get("hosts") == (hosts if hosts > 1 else None)


@given(st.integers(0, 4), st.integers(2, 5), st.data())
def test_serves_is_membership_of_the_leaf_in_the_subtree(depth, fanout, data):
    shape = TreeShape(depth, fanout)
    path = tuple(data.draw(st.lists(st.integers(0, fanout - 1), max_size=depth)))
    eid = data.draw(st.integers(0, 10_000))
    leaf = shape.leaf_path(shape.leaf_of(eid))
    assert shape.serves(path, eid) == (leaf[: len(path)] == path)


@given(shapes, engine_lists, st.data())
def test_split_with_overrides_is_the_rule_with_each_override_applied(shape, eids, data):
    """A node's learned routes (engines announced under another child than the
    modulo rule's) are applied per engine, in target order."""
    for path in shape.nodes():
        if shape.is_leaf(path):
            continue
        digits = st.integers(0, shape.fanout - 1)
        overrides = data.draw(st.dictionaries(st.sampled_from(eids) if eids else st.nothing(), digits))
        expected = {}
        for e in eids:
            expected.setdefault(overrides.get(e, shape.child_digit(path, e)), []).append(e)
        assert shape.split(path, eids, overrides) == expected


@given(st.integers(1, 9), st.lists(st.tuples(st.booleans(), st.integers(0, 80)), max_size=80))
def test_the_kept_leaf_loads_place_as_a_count_of_every_live_engine_does(n_leaves, changes):
    """``LeafLoads`` is told each change, as the engine ledger tells it; it
    places a new engine where counting every live engine would."""
    from ipyparallel_broadcast.controller.placement import LeafLoads

    loads, live = LeafLoads(n_leaves, [0, 1]), {0, 1}
    for arrives, eid in changes:
        (loads.live if arrives else loads.gone)(eid)
        (live.add if arrives else live.discard)(eid)
        next_id = max(live, default=-1) + 1
        assert loads.place(next_id) == balanced_id(next_id, live, n_leaves)
