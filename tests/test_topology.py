from hypothesis import given
from hypothesis import strategies as st

from ipyparallel_broadcast.topology import TreeShape, node_identity, node_name, render

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
