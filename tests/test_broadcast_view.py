"""BroadcastView on real clusters: every operation, both reply modes, several
tree shapes, target subsets (including all targets under one leaf)."""

import io
import os
import sys

import ipyparallel as ipp
import numpy as np
import pytest
from cluster_util import at_gate, running_cluster
from ipyparallel import error

from ipyparallel_broadcast.wire import protocol as P

pytestmark = pytest.mark.cluster

# (engines, depth, fanout): depth 0, 1, 2 and fan-out 2 and 3
SHAPES = [(2, 0, 2), (4, 1, 3), (5, 2, 2)]
MODES = [True, False]


@pytest.fixture(scope="module", params=SHAPES, ids=lambda s: f"n{s[0]}-d{s[1]}-f{s[2]}")
def rc(request):
    n, depth, fanout = request.param
    with running_cluster(n, depth, fanout) as client:
        yield client


@pytest.fixture(params=MODES, ids=["coalescing", "streaming"])
def coalescing(request):
    return request.param


def subsets(rc):
    """Target lists worth trying on this cluster."""
    shape = rc.tree_shape
    ids = rc.ids
    one_leaf = [e for e in ids if shape.leaf_of(e) == 0]
    return [ids, ids[::-1], ids[:1], ids[1::2], one_leaf, [ids[-1], ids[0]]]


def test_tree_is_visible(rc):
    layout = rc.broadcast_tree()
    shape = rc.tree_shape
    assert (layout.depth, layout.fanout) == (shape.depth, shape.fanout)
    assert len(layout.leaves) == shape.fanout**shape.depth
    assert sorted(e for es in layout.leaves.values() for e in es) == rc.ids
    for leaf, eids in layout.leaves.items():
        assert all(e % len(layout.leaves) == leaf for e in eids)
    assert f"depth={shape.depth} fanout={shape.fanout}" in repr(layout)


def _frozen():
    import gc

    return gc.get_freeze_count()


def test_engines_keep_their_start_up_objects_out_of_every_collection(rc):
    """A full collection of an engine's start-up objects (IPython, the modules)
    took 13-20 ms: a reply, and so a broadcast, late by that."""
    assert all(count > 10_000 for count in rc.broadcast_view().apply_sync(_frozen))


def test_history_lists_each_engines_id_and_keeps_one_entry_per_call(rc, coalescing):
    """ipyparallel's contract (the hub's records agree), at a cost per call, not per engine."""
    view = rc.broadcast_view(coalescing=coalescing)
    before, entries = len(rc.history), len(rc.history._items)
    ars = [view.apply_async(lambda: 1) for _ in range(3)] + [view.push(dict(a=1), block=False)]
    for ar in ars:
        ar.get(timeout=20)
    assert rc.history[before:] == [vid for ar in ars for vid in ar.msg_ids]
    assert len(rc.history._items) - entries == len(ars)
    assert view.history == [vid for ar in ars for vid in ar.msg_ids]
    assert all(vid in rc.history for ar in ars for vid in ar.msg_ids)


def test_a_bounded_history_forgets_old_calls_and_every_view_still_records_its_own(rc):
    """``Client.history_limit``: the client stays small over many calls, and
    ipyparallel's DirectView (which reads its new ids as ``history[-n:]``)
    and the BroadcastView still find each call's ids."""
    old = rc.history_limit
    rc.history_limit = 6
    try:
        bview, dview = rc.broadcast_view(), rc[:]
        assert bview.history.limit == 6
        for _ in range(10):
            bar, dar = bview.apply_async(os.getpid), dview.apply_async(os.getpid)
            bar.get(timeout=20), dar.get(timeout=20)
            assert bview.history[-len(rc) :] == bar.msg_ids
            assert dview.history[-len(rc) :] == dar.msg_ids
            assert rc.history[-len(rc) :] == dar.msg_ids
        assert len(rc.history._items) <= 6 and len(bview.history._items) <= 6
        assert rc.history.forgotten > 0
        with pytest.raises(IndexError, match="history_limit"):
            rc.history[0]
        # -1 is the newest id: a broadcast's, found without the hub (a DirectView's
        # finished id is asked of the hub, whose record of it may still be on its way)
        last = bview.apply_async(os.getpid)
        assert rc.history[-1] == last.msg_ids[-1]
        assert rc.get_result(-1).get(timeout=20) in (last.get()[-1], last.get()[-1:])
    finally:
        rc.history_limit = old


def test_a_call_refused_before_it_is_sent_leaves_nothing_owed(rc):
    """A malformed request (a batch on a coalesced call) raises, and leaves no
    call waited on, nor a number that would hold the engines' kept replies back."""
    uuids, eids = rc.resolve_targets(rc.ids)
    owed, live = dict(rc._root_watch.copies.owed), set(rc._calls.live)
    with pytest.raises(P.ProtocolError, match="batch"):
        rc.send_broadcast("apply_request", eids, uuids, batch=[2, None])
    assert rc._root_watch.copies.owed == owed and set(rc._calls.live) == live
    assert rc.broadcast_view().apply_sync(os.getpid) is not None


def test_apply_in_target_order(rc, coalescing):
    for targets in subsets(rc):
        view = rc.broadcast_view(targets, coalescing=coalescing)
        ar = view.apply_async(lambda x: (x, __import__("os").getpid()), 7)
        result = ar.get(timeout=20)
        assert [r[0] for r in result] == [7] * len(targets)
        assert ar.engine_id == targets
        assert len(set(r[1] for r in result)) == len(targets)  # one process each
        assert len(ar.msg_ids) == len(targets)


def test_apply_sync_and_block(rc, coalescing):
    view = rc.broadcast_view(coalescing=coalescing)
    assert view.apply_sync(lambda a, b=0: a + b, 1, b=2) == [3] * len(rc)
    view.block = True
    assert view.apply(lambda: "blocked") == ["blocked"] * len(rc)
    view.block = False
    ar = view.apply(lambda: "async")
    assert isinstance(ar, ipp.AsyncResult)
    assert ar.get(timeout=20) == ["async"] * len(rc)


def test_single_int_target(rc, coalescing):
    view = rc.broadcast_view(rc.ids, coalescing=coalescing)
    ar = view._really_apply(lambda: 5, targets=rc.ids[-1], block=False)
    assert ar.get(timeout=20) == 5


def test_numpy_round_trip(rc, coalescing):
    view = rc.broadcast_view(coalescing=coalescing)
    a = np.arange(250_000, dtype=np.float64)  # 2 MB, sent zero-copy
    result = view.apply_sync(lambda x: x * 2, a)
    for r in result:
        np.testing.assert_array_equal(r, a * 2)


def test_execute_and_outputs(rc, coalescing):
    view = rc.broadcast_view(coalescing=coalescing)
    ar = view.execute(
        "import sys, os\nprint('out', os.getpid())\nprint('err', file=sys.stderr)\nvalue = 41 + 1",
        block=True,
    )
    assert ar.successful()
    assert len(ar.stdout) == len(rc)
    assert all(s.startswith("out ") for s in ar.stdout)
    assert len(set(ar.stdout)) == len(rc)  # each engine's own output
    assert ar.stderr == ["err\n"] * len(rc)
    assert view["value"] == [42] * len(rc)


def test_apply_outputs_per_engine(rc, coalescing):
    view = rc.broadcast_view(coalescing=coalescing)

    def talk():
        import os
        import sys

        print("pid", os.getpid())
        print("warn", file=sys.stderr)
        return os.getpid()

    ar = view.apply_async(talk)
    pids = ar.get(timeout=20)
    ar.wait_for_output(timeout=20)
    assert ar.stdout == [f"pid {p}\n" for p in pids]
    assert ar.stderr == ["warn\n"] * len(rc)


def test_push_pull_getitem_setitem(rc, coalescing):
    view = rc.broadcast_view(coalescing=coalescing)
    view.push({"a": 1, "b": [1, 2]}, block=True)
    assert view.pull("a", block=True) == [1] * len(rc)
    assert view.pull(("a", "b"), block=True) == [[1, [1, 2]]] * len(rc)
    view["c"] = "see"
    assert view["c"] == ["see"] * len(rc)
    sub = rc.broadcast_view(rc.ids[:1], coalescing=coalescing)
    sub["c"] = "only"
    assert view["c"] == ["only"] + ["see"] * (len(rc) - 1)


def test_metadata(rc, coalescing):
    view = rc.broadcast_view(coalescing=coalescing)
    ar = view.apply_async(lambda: None)
    ar.get(timeout=20)
    assert ar.engine_id == rc.ids
    assert sorted(ar.engine_uuid) == sorted(rc._engines[e] for e in rc.ids)
    for md in ar.metadata:
        assert md["started"] <= md["completed"]
        assert md["status"] == "ok"
    assert ar.ready() and ar.successful()
    first_sent = min(md["submitted"] for md in ar.metadata)
    last_in = max(md["received"] for md in ar.metadata)
    assert first_sent < last_in and ar.wall_time == (last_in - first_sent).total_seconds()


def test_remote_errors(rc, coalescing):
    view = rc.broadcast_view(coalescing=coalescing)

    ar = view.apply_async(lambda: 1 / 0)
    with pytest.raises(error.CompositeError) as info:
        ar.get(timeout=20)
    ce = info.value
    assert len(ce.elist) == len(rc)
    assert [e[0] for e in ce.elist] == ["ZeroDivisionError"] * len(rc)
    assert sorted(e[3]["engine_id"] for e in ce.elist) == rc.ids
    with pytest.raises(error.RemoteError) as first:
        ce.raise_exception()
    assert first.value.ename == "ZeroDivisionError"
    results = ar.get(return_exceptions=True)
    assert all(isinstance(r, error.RemoteError) for r in results)


def test_partial_errors_keep_good_results(rc, coalescing):
    ids = rc.ids
    assert len(ids) >= 2  # (every shape has two engines or more, and no test here kills one)
    view = rc.broadcast_view(coalescing=coalescing)
    view.scatter("rank", ids, flatten=True, block=True)
    ar = view.apply_async(ipp.Reference("int"), ipp.Reference("rank"))
    assert ar.get(timeout=20) == ids
    ar = view.execute(f"assert rank != {ids[0]}, 'bad rank'")
    with pytest.raises(error.CompositeError):
        ar.get(timeout=20)
    results = ar.get(return_exceptions=True)
    assert isinstance(results[0], error.RemoteError) and results[0].ename == "AssertionError"
    assert all(not isinstance(r, Exception) for r in results[1:])


def test_ready_wait_and_progress(rc, coalescing, tmp_path, monkeypatch):
    view = rc.broadcast_view(coalescing=coalescing)
    gate = tmp_path / "gate"
    ar = view.apply_async(at_gate, str(gate))
    assert not ar.ready()
    assert ar.wait(0.05) is False  # the engines hold it until the gate opens

    class OpensTheGate(io.StringIO):
        """stdout: the progress bar's first line opens the gate."""

        def write(self, text):
            gate.touch()
            return super().write(text)

    out = OpensTheGate()
    monkeypatch.setattr(sys, "stdout", out)
    ar.wait_interactive(interval=0.1)
    assert ar.ready() and ar.successful()
    assert f"0/{len(rc)}" in out.getvalue() and f"{len(rc)}/{len(rc)}" in out.getvalue()
    assert view.wait(timeout=10)


def test_per_engine_parts_are_made_only_when_read(rc, coalescing):
    ar = rc.broadcast_view(coalescing=coalescing).apply_async(os.getpid)
    pids = ar.get(timeout=30)
    call = ar._call
    assert call.children is None and call.mds is None  # one call, nothing made per engine
    assert [m["engine_id"] for m in ar.metadata] == rc.ids
    assert all(m["completed"] and m["engine_uuid"] for m in ar.metadata)
    assert call.mds is not None and call.children is None
    assert rc.wait(ar, timeout=30)
    assert rc.get_result(ar.msg_ids[-1]).get(timeout=30) == pids[-1]  # a recent call, from the client
    ar = rc.broadcast_view(coalescing=coalescing).apply_async(os.getpid)
    assert rc.wait(ar.msg_ids[0], timeout=30)  # a per-engine id waits for its call
    assert list(ar) == ar.get()


def test_no_targets(rc, coalescing):
    view = rc.broadcast_view([], coalescing=coalescing)
    before = set(rc._calls.live)  # earlier calls may still await their last IOPub
    with pytest.raises(ValueError, match="at least one target"):
        view.apply_sync(lambda: 1)
    with pytest.raises(ValueError, match="at least one target"):
        view.execute("x = 1")
    assert set(rc._calls.live) <= before  # the refused calls left nothing pending


def test_view_attributes(rc, coalescing):
    view = rc.broadcast_view(coalescing=coalescing)
    assert view.targets == "all" and view.is_coalescing == coalescing
    sub = rc.broadcast_view(rc.ids[:2], is_coalescing=coalescing)
    assert sub.targets == rc.ids[:2] and sub.coalescing == coalescing
    assert ("coalescing" if coalescing else "streaming") in repr(sub)
    with pytest.raises(ValueError):
        rc.broadcast_view([rc.ids[0], rc.ids[0]]).apply_sync(lambda: 1)


def test_map_and_scatter_gather_through_tree(rc, coalescing):
    view = rc.broadcast_view(coalescing=coalescing)
    assert view.map_sync(lambda x: x * x, range(10)) == [x * x for x in range(10)]
    view.scatter("part", list(range(12)), block=True)
    assert view.gather("part", block=True) == list(range(12))
