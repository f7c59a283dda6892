"""Tree or direct: the chooser alone, then a view in 'auto' on a real cluster."""

import numpy as np
import pytest
from cluster_util import running_cluster, until
from hypothesis import given, settings
from hypothesis import strategies as st
from ipyparallel.client.asyncresult import AsyncMapResult

from ipyparallel_broadcast.client.paths import DIRECT, TREE, PathChooser
from ipyparallel_broadcast.client.results import TreeAsyncMapResult

pytestmark = pytest.mark.cluster


def _run(chooser, times, calls, op="gather", engines=8, nbytes=2**23):
    """Paths taken over ``calls`` calls, each path taking ``times[path]`` seconds."""
    taken = []
    for _ in range(calls):
        path = chooser.choose(op, engines, nbytes)
        chooser.record(op, engines, nbytes, path, times[path])
        taken.append(path)
    return taken


def test_each_path_twice_then_the_faster_with_the_slower_retried_now_and_then():
    chooser = PathChooser(retry_every=4)
    taken = _run(chooser, {TREE: 0.060, DIRECT: 0.045}, 40)
    assert taken[:4] == [TREE, TREE, DIRECT, DIRECT]
    rest = taken[4:]
    assert rest.count(TREE) == len(rest) // 8  # 0.060 / 0.045: tried every 4 x 2 calls
    assert rest.count(DIRECT) == len(rest) - len(rest) // 8


def test_a_change_in_the_cluster_is_followed():
    chooser = PathChooser(retry_every=4)
    _run(chooser, {TREE: 0.06, DIRECT: 0.04}, 20)
    taken = _run(chooser, {TREE: 0.02, DIRECT: 0.04}, 40)  # the tree got faster
    assert taken[-16:].count(DIRECT) == 2  # direct now the one retried, once in 4 x 2 calls


def test_a_first_slow_call_does_not_condemn_a_path():
    chooser = PathChooser()
    chooser.record("scatter", 8, 2**23, TREE, 5.0)  # cold: imports, connections
    chooser.record("scatter", 8, 2**23, TREE, 0.03)
    chooser.record("scatter", 8, 2**23, DIRECT, 0.05)
    chooser.record("scatter", 8, 2**23, DIRECT, 0.05)
    assert chooser.choose("scatter", 8, 2**23) == TREE


def test_one_slow_call_does_not_flip_the_choice():
    chooser = PathChooser()
    _run(chooser, {TREE: 0.02, DIRECT: 0.04}, 10)
    chooser.record("gather", 8, 2**23, TREE, 0.5)  # a collection, a burst of page faults
    assert chooser.choose("gather", 8, 2**23) == TREE
    for _ in range(3):  # the tree really got slower: followed once most recent calls say so
        chooser.record("gather", 8, 2**23, TREE, 0.5)
    assert chooser.choose("gather", 8, 2**23) == DIRECT


def test_many_engines_always_take_the_tree_and_classes_are_apart():
    chooser = PathChooser(max_direct=64)
    assert _run(chooser, {TREE: 1.0, DIRECT: 0.1}, 10, engines=1024) == [TREE] * 10
    _run(chooser, {TREE: 1.0, DIRECT: 0.1}, 10, nbytes=2**23)
    assert chooser.choose("gather", 8, 2**10) == TREE  # another size class: learnt apart
    assert chooser.choose("scatter", 8, 2**23) == TREE  # another operation


@settings(max_examples=50, deadline=None)
@given(st.floats(0.001, 1.0), st.floats(0.001, 1.0), st.integers(1, 32))
def test_the_slower_path_is_never_more_than_its_share(tree, direct, retry):
    chooser = PathChooser(retry_every=retry)
    taken = _run(chooser, {TREE: tree, DIRECT: direct}, 200)[4:]
    slow = TREE if tree > direct else DIRECT
    assert taken.count(slow) <= len(taken) // retry + 1


def test_bad_records_are_refused():
    with pytest.raises(ValueError):
        PathChooser().record("gather", 8, 1, "sideways", 0.1)
    with pytest.raises(ValueError):
        PathChooser().record("gather", 8, 1, TREE, float("nan"))


def test_auto_takes_both_paths_with_the_same_results():
    with running_cluster(4, 1, 2) as rc:
        view = rc.broadcast_view(block=True, path="auto")
        data = np.arange(4 * 1000.0)
        view.scatter("x", data)
        view.gather("x")  # the size of x is learnt: later gathers are classed by it
        until(lambda: "x" in rc._paths.sizes, what="the gathered size")
        timed = sum(rc._paths.counts.values())
        kinds = []
        for _ in range(4):
            ar = view.gather("x", block=False)
            kinds.append(type(ar))
            assert np.array_equal(ar.get(), data)
            timed += 1  # each call is told once done (its callback may follow get())
            until(lambda timed=timed: sum(rc._paths.counts.values()) == timed, what="the call's time")
        assert kinds == [TreeAsyncMapResult] * 2 + [AsyncMapResult] * 2  # tree twice, then direct
        streaming = rc.broadcast_view(block=True, path="auto", coalescing=False)
        ar = streaming.gather("x", block=False)
        assert type(ar) is TreeAsyncMapResult and np.array_equal(ar.get(), data)  # learnt apart
        for _ in range(4):
            view.scatter("x", data)
            assert view.map(lambda x: x * 2, range(20)) == [x * 2 for x in range(20)]
            assert np.array_equal(view.gather("x"), data)
        until(
            lambda: (
                {(kind.split()[0], path) for kind, *_, path in rc._paths.times}
                == {(op, path) for op in ("scatter", "gather", "map") for path in (TREE, DIRECT)}
            ),
            what="both paths of every operation timed",
        )
        # fixed paths are taken every time, and not timed
        before = dict(rc._paths.counts)
        direct = rc.broadcast_view(block=True, path="direct")
        assert type(direct.gather("x", block=False)) is AsyncMapResult
        assert type(rc.broadcast_view(path="tree").gather("x", block=False)) is TreeAsyncMapResult
        with direct.temp_flags(trace=True):  # a traced call is about the tree: it takes it
            assert type(direct.gather("x", block=False)) is TreeAsyncMapResult
        rc.wait()
        assert rc._paths.counts == before
