"""Collectives on real clusters: scatter, gather, map, reduce, partial
coalescing and auto mode, at depths 0, 1 and 2."""

import functools
import json
import logging
import os
import re
import tempfile
import time

import ipyparallel as ipp
import numpy as np
import pytest
from cluster_util import running_cluster, until
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from ipyparallel import error

import ipyparallel_broadcast as ipb
from ipyparallel_broadcast.client import view as view_module
from ipyparallel_broadcast.client.modes import AUTO_STREAM_BYTES
from ipyparallel_broadcast.wire import protocol as P
from ipyparallel_broadcast.wire.reduction import OPS, ufunc

pytestmark = pytest.mark.cluster

SHAPES = [(4, 0, 2), (6, 1, 2), (8, 2, 2)]
MODES = [True, False, ipb.Batch(2, 0.02)]


@pytest.fixture(scope="module", params=SHAPES, ids=lambda s: f"n{s[0]}-d{s[1]}-f{s[2]}")
def rc(request):
    n, depth, fanout = request.param
    with running_cluster(n, depth, fanout) as client:
        client[:].execute("import numpy as np", block=True)
        yield client


@pytest.fixture(params=MODES, ids=["coalescing", "streaming", "partial"])
def coalescing(request):
    return request.param


class Sends:
    """Counts the requests the client sends to the tree and the messages to
    the mux (pings to the root, while calls are in flight, apart)."""

    def __init__(self, rc):
        self.rc, self.tree, self.mux, self.frames, self.pings = rc, 0, 0, [], 0

    def __enter__(self):
        tree, mux = self.rc._broadcast_stream, self.rc._mux_stream

        def to_tree(frames, *a, **kw):
            if json.loads(bytes(frames[2]))["msg_type"] == P.PING:
                self.pings += 1
                return type(tree).send_multipart(tree, frames, *a, **kw)
            self.tree += 1
            self.frames.append(frames)
            return type(tree).send_multipart(tree, frames, *a, **kw)

        def to_mux(*a, **kw):
            self.mux += 1
            return type(mux).send_multipart(mux, *a, **kw)

        tree.send_multipart, mux.send_multipart = to_tree, to_mux
        return self

    def __exit__(self, *exc):
        del self.rc._broadcast_stream.send_multipart, self.rc._mux_stream.send_multipart


def test_scatter_is_one_message_and_each_engine_gets_its_part(rc, coalescing):
    targets = rc.ids[::-1]
    view = rc.broadcast_view(targets, coalescing=coalescing, block=True)
    with Sends(rc) as sends:
        view.scatter("x", list(range(3 * len(targets) + 1)))
        rc.wait(timeout=10)
    assert (sends.tree, sends.mux) == (1, 0)
    parts = ipp.client.map.Map()
    for index, eid in enumerate(targets):
        expected = parts.getPartition(list(range(3 * len(targets) + 1)), index, len(targets))
        assert rc[eid]["x"] == expected
    assert view.gather("x") == list(range(3 * len(targets) + 1))


def test_scatter_flatten_and_fewer_items_than_engines(rc):
    view = rc.broadcast_view(block=True)
    view.scatter("rank", rc.ids, flatten=True)
    assert view["rank"] == rc.ids
    view.scatter("y", [1, 2])
    assert view["y"] == [[1], [2]] + [[]] * (len(rc) - 2)


def test_numpy_scatter_sends_views_of_the_array(rc):
    a = np.arange(len(rc) * 64 * 1024, dtype=np.float64).reshape(len(rc) * 64, 1024)
    view = rc.broadcast_view(block=True)
    with Sends(rc) as sends:
        ar = view.scatter("a", a, block=False, track=True)
        ar.wait_for_send(10)
        ar.get(10)
    (frames,) = sends.frames
    shared = [f for f in frames if isinstance(f, memoryview) and np.shares_memory(np.asarray(f), a)]
    assert len(shared) == len(rc), "each partition is sent from the array's own memory"
    np.testing.assert_array_equal(view.gather("a"), a)
    assert view.apply(np.shape, ipp.Reference("a")) == [(64, 1024)] * len(rc)


def test_gather_in_target_order(rc, coalescing):
    targets = rc.ids[::-1][::2]
    view = rc.broadcast_view(targets, coalescing=coalescing, block=True)
    view.scatter("a", np.arange(10 * len(targets)))
    with Sends(rc) as sends:
        ar = view.gather("a", block=False)
        gathered = ar.get(10)
    assert sends.tree == 1
    np.testing.assert_array_equal(gathered, np.arange(10 * len(targets)))
    assert ar.engine_id == targets


def test_a_gather_joins_on_the_reading_thread_and_is_let_go_with_its_result(rc):
    """The join (a copy of every part) is put off until the result is read, not
    run on the client's I/O thread; a user callback reads the joined value; and
    the client's recent calls do not keep a dropped AsyncResult (nor its value) alive."""
    import gc
    import weakref
    from concurrent.futures import Future

    from ipyparallel_broadcast.client.results import Unjoined

    view = rc.broadcast_view(block=True)
    view.scatter("a", np.arange(10 * len(rc)))
    ar = view.gather("a", block=False)
    ar.wait(10)
    stored = Future.result(ar)
    assert type(stored) is Unjoined and stored.join is not None  # not joined as the call completed...
    seen = []
    ar.add_done_callback(lambda f: seen.append(f.result()))  # (a done future: called here, now)
    np.testing.assert_array_equal(seen[0], np.arange(10 * len(rc)))
    assert stored.join is None and ar.get() is seen[0] is ar.get()  # ...but once, when first read
    gone = weakref.ref(ar)
    del ar, stored
    gc.collect()
    assert gone() is None


def test_calls_leave_no_reference_cycles(rc):
    """A finished call's objects are freed by their reference counts, not
    later by a collection: big results (mapped segments) go when dropped."""
    import gc

    from ipyparallel_broadcast.client.calls import Call
    from ipyparallel_broadcast.wire.bundles import ReplyTable

    ours = {"Call", "ReplyTable", "Entry", "EngineFuture", "TreeAsyncResult", "TreeAsyncMapResult"}
    assert {Call.__name__, ReplyTable.__name__} <= ours
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for mode in (True, "auto", False):
            view = rc.broadcast_view(block=True, coalescing=mode)
            view.scatter("a", np.arange(10 * len(rc)))
            for _ in range(3):
                view.gather("a")
                view.apply(square, 3)  # (a reduction's AsyncResult is ipyparallel's own, cycles and all)
        gc.collect()
        left = sorted({type(o).__name__ for o in gc.garbage} & ours)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert left == []


def square(x):
    return x * x


def test_map_is_one_message(rc, coalescing):
    view = rc.broadcast_view(coalescing=coalescing)
    with Sends(rc) as sends:
        assert view.map_sync(square, range(1000)) == [x * x for x in range(1000)]
        amr = view.map_async(lambda x, y: x + y, range(50), range(50))
        assert list(amr) == list(range(0, 100, 2))
    assert (sends.tree, sends.mux) == (2, 0)
    assert view.map_sync(square, []) == []
    assert view.map_sync(square, range(2)) == [0, 1]  # fewer items than engines


def test_map_return_exceptions(rc, coalescing):
    view = rc.broadcast_view(coalescing=coalescing)
    result = view.map(lambda x: 1 // x, range(len(rc) * 2), block=True, return_exceptions=True)
    assert isinstance(result[0], error.RemoteError) and result[0].ename == "ZeroDivisionError"
    # the failing chunk's items all report it, the others are results
    with pytest.raises(error.CompositeError):
        view.map_sync(lambda x: 1 // x, range(len(rc) * 2))


def test_parallel_decorator_runs_through_the_tree(rc):
    view = rc.broadcast_view()

    @view.parallel(block=True)
    def lengths(chunk):
        return len(chunk)

    with Sends(rc) as sends:
        assert sum(lengths(range(100))) == 100
    assert (sends.tree, sends.mux) == (1, 0)


# ------------------------------------------------------------------ reduce
@pytest.mark.parametrize("op", sorted(OPS))
def test_reduce_is_one_message_one_value(rc, op):
    view = rc.broadcast_view(block=True)
    view.scatter("rank", rc.ids, flatten=True)
    before = rc._replies.received
    with Sends(rc) as sends:
        result = view.reduce(ipp.interactive(lambda: np.full(4, rank + 1.0)), op=op)  # noqa: F821
    assert (sends.tree, rc._replies.received - before) == (1, 1)
    expected = functools.reduce(ufunc(op), [np.full(4, e + 1.0) for e in rc.ids])
    np.testing.assert_array_equal(result, expected)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    op=st.sampled_from(sorted(OPS)),
    dtype=st.sampled_from(["int16", "int64", "uint8", "float32", "float64"]),
    shape=hnp.array_shapes(min_dims=0, max_dims=2, max_side=5),
    seed=st.integers(0, 2**16),
)
def test_reduce_equals_combining_gathered_results(rc, op, dtype, shape, seed):
    view = rc.broadcast_view(block=True)
    rng = np.random.default_rng(seed)
    values = [rng.integers(0, 5, size=shape).astype(dtype) for _ in rc.ids]
    view.scatter("v", values, flatten=True)
    gathered = view.pull("v")  # the client-side reference: gather, then combine
    expected = functools.reduce(ufunc(op), gathered)
    result = view.reduce(ipp.interactive(lambda: v), op=op)  # noqa: F821
    assert np.asarray(result).dtype == np.asarray(expected).dtype
    np.testing.assert_array_equal(result, expected)


RANK = ipp.interactive(lambda: rank)  # noqa: F821  (the engine's own variable)


def test_reduce_python_numbers_and_concat(rc):
    view = rc.broadcast_view(block=True)
    view.scatter("rank", rc.ids, flatten=True)
    assert view.reduce(RANK, op="sum") == sum(rc.ids)
    assert view.reduce(ipp.interactive(lambda: rank + 0.5), op="max") == max(rc.ids) + 0.5  # noqa: F821
    assert view.reduce(lambda: 2, op="prod") == 2 ** len(rc)
    assert view.reduce(ipp.interactive(lambda: [rank]), op="concat") == rc.ids  # noqa: F821
    rev = rc.broadcast_view(rc.ids[::-1], block=True)
    np.testing.assert_array_equal(
        rev.reduce(ipp.interactive(lambda: np.array([rank, rank])), op="concat"),  # noqa: F821
        np.repeat(rc.ids[::-1], 2),
    )


def test_reduce_errors_name_the_engines(rc):
    view = rc.broadcast_view(block=True)
    view.scatter("rank", rc.ids, flatten=True)
    odd = rc.ids[1]
    with pytest.raises(ipb.ReduceError, match=rf"engines \[[^]]*\b{odd}\b[^]]*\] gave a float64 array of shape \(3,\)"):
        view.reduce(ipp.interactive(lambda: np.zeros(3 if rank == 1 else 2)), op="sum")  # noqa: F821
    with pytest.raises(error.CompositeError) as info:
        view.reduce(ipp.interactive(lambda: 1 // (rank - 1)), op="sum")  # noqa: F821
    assert [e[0] for e in info.value.elist] == ["ZeroDivisionError"]
    with pytest.raises(error.CompositeError, match="TypeError"):
        view.reduce(lambda: "text", op="max")
    with pytest.raises(ValueError, match="op must be one of"):
        view.reduce(lambda: 1, op="mean")
    assert view.apply(lambda: 1) == [1] * len(rc)  # nothing is stuck


def test_big_reduce_values_come_through_shared_memory_and_leave_no_segment(rc):
    view = rc.broadcast_view(block=True)
    view.scatter("rank", rc.ids, flatten=True)

    def taken():
        return sum(node.get("shm_values") or 0 for node in rc.broadcast_stats())

    def names():
        return {n for n in os.listdir("/dev/shm") if n.startswith("ipb-shm-")}

    before, segments = taken(), names()
    f = ipp.interactive(lambda: np.full(1 << 18, rank + 1.0))  # noqa: F821  (2 MiB each)
    for op in sorted(OPS):
        expected = functools.reduce(ufunc(op), [np.full(1 << 18, e + 1.0) for e in rc.ids])
        np.testing.assert_array_equal(view.reduce(f, op=op), expected)
    assert taken() - before == len(OPS) * len(rc)  # every engine's value, read from this host's memory
    assert names() <= segments


def test_a_big_value_held_for_its_host_is_not_changed_by_the_next_request(rc):
    view = rc.broadcast_view(block=False)
    view.scatter("rank", rc.ids, flatten=True).get(timeout=60)
    view.execute("import numpy as np; big = np.full(1 << 18, rank + 1.0)").get(timeout=60)
    ar = view.reduce(ipp.interactive(lambda: big), op="sum")  # noqa: F821  (each engine's own array, not a copy)
    later = view.execute("big += 100")  # queued on every engine while it holds ``big`` for its relay
    expected = functools.reduce(np.add, [np.full(1 << 18, e + 1.0) for e in rc.ids])
    np.testing.assert_array_equal(ar.get(timeout=60), expected)
    later.get(timeout=60)
    again = view.reduce(ipp.interactive(lambda: big), op="sum")  # noqa: F821
    np.testing.assert_array_equal(again.get(timeout=60), expected + 100 * len(rc))


def test_a_float_reduce_is_bitwise_the_same_every_time(rc):
    view = rc.broadcast_view(block=True)
    view.scatter("rank", rc.ids, flatten=True)
    # magnitudes far apart: the sum depends on the order values are combined in
    f = ipp.interactive(lambda: np.array([1e16, 1.0, -1e16, 3.3e-3, 7e15])[rank % 5] * np.ones(64))  # noqa: F821
    sums = {view.reduce(f, op="sum").tobytes() for _ in range(6)}
    assert len(sums) == 1


# ------------------------------------------------------------------ allreduce
@pytest.mark.parametrize("op", sorted(OPS))
def test_allreduce_binds_the_value_in_every_engine_with_one_message_each_way(rc, op):
    view = rc.broadcast_view(block=True)
    view.scatter("rank", rc.ids, flatten=True)
    before = rc._replies.received
    with Sends(rc) as sends:
        result = view.allreduce(ipp.interactive(lambda: np.full(4, rank + 1.0)), op=op, name="total")  # noqa: F821
    assert result is None and (sends.tree, rc._replies.received - before) == (1, 1)
    expected = functools.reduce(ufunc(op), [np.full(4, e + 1.0) for e in rc.ids])
    for got in view.pull("total"):
        np.testing.assert_array_equal(got, expected)


def test_allreduce_of_a_big_array_lands_in_every_engine_writable_and_its_own(rc):
    view = rc.broadcast_view(block=True)
    view.scatter("rank", rc.ids, flatten=True)
    n = 1 << 19  # 4 MiB of float64: shared memory's path, as a push's
    f = ipp.interactive(lambda: np.full(1 << 19, rank, dtype=float))  # noqa: F821

    def segments():
        return sum(node.get("shm_segments") or 0 for node in rc.broadcast_stats())

    before = segments()
    ar = view.allreduce(f, op="sum", name="big", block=False)
    assert ar.get(timeout=60) is None
    assert segments() - before == 1  # one copy in this host's memory, mapped by every engine
    view.execute("big[0] += rank")  # each engine's writes are its own
    firsts = view.apply(ipp.interactive(lambda: (float(big[0]), float(big[-1]), big.shape)))  # noqa: F821
    total = float(sum(rc.ids))
    assert firsts == [(total + e, total, (n,)) for e in rc.ids]


def test_allreduce_python_numbers_and_a_subset_of_engines(rc):
    view = rc.broadcast_view(block=True)
    view.scatter("rank", rc.ids, flatten=True)
    view.execute("count = None")
    some = rc.ids[1:3]
    rc.broadcast_view(some, block=True).allreduce(RANK, op="sum", name="count")
    assert view.pull("count") == [sum(some) if e in some else None for e in rc.ids]
    view.allreduce(lambda: 2**70, op="prod", name="count")  # exact: Python ints
    assert view.pull("count") == [2 ** (70 * len(rc))] * len(rc)


def test_a_failed_allreduce_leaves_every_engine_its_old_value(rc):
    view = rc.broadcast_view(block=True)
    view.scatter("rank", rc.ids, flatten=True)
    view.execute("kept = 'old'")
    with pytest.raises(error.CompositeError) as info:
        view.allreduce(ipp.interactive(lambda: 1 // (rank - 1)), op="sum", name="kept")  # noqa: F821
    assert [e[0] for e in info.value.elist] == ["ZeroDivisionError"]
    with pytest.raises(ipb.ReduceError, match="shape"):
        view.allreduce(ipp.interactive(lambda: np.zeros(3 if rank == 1 else 2)), op="sum", name="kept")  # noqa: F821
    assert view.pull("kept") == ["old"] * len(rc)
    for bad in ("", "1x", "a.b", None):
        with pytest.raises(ValueError, match="name must be"):
            view.allreduce(lambda: 1, name=bad)
    with pytest.raises(ValueError, match="op must be one of"):
        view.allreduce(lambda: 1, op="concat", name="x")


# ------------------------------------------------------- partial coalescing
def test_partial_coalescing_delivers_batch_by_batch(rc):
    """Engines past the first two wait for a gate file: the first batch must
    arrive, and be usable, while they are still running."""
    gate = os.path.join(tempfile.mkdtemp(prefix="ipb-gate-"), "open")
    first = [e for e in rc.ids if rc.tree_shape.leaf_of(e) == 0][:2]
    view = rc.broadcast_view(coalescing=ipb.Batch(count=2))

    def work(eid, fast, gate):
        import os
        import time

        while eid not in fast and not os.path.exists(gate):
            time.sleep(0.01)
        return eid

    view.scatter("eid", rc.ids, flatten=True, block=True)
    before = rc._replies.received
    ar = view.apply_async(work, ipp.Reference("eid"), first, gate)
    deadline = time.monotonic() + 30
    while not all(ar._children[rc.ids.index(e)].done() for e in first):
        assert time.monotonic() < deadline, "the first batch never came"
        time.sleep(0.01)
    assert ar.progress == 2 and not ar.ready()
    open(gate, "w").close()
    assert ar.get(30) == rc.ids
    per_leaf = {}
    for e in rc.ids:
        per_leaf[rc.tree_shape.leaf_of(e)] = per_leaf.get(rc.tree_shape.leaf_of(e), 0) + 1
    assert rc._replies.received - before == sum(-(-n // 2) for n in per_leaf.values())


def test_batch_and_int_settings(rc):
    assert rc.broadcast_view(coalescing=3).coalescing == ipb.Batch(3)
    with pytest.raises(ValueError):
        ipb.Batch(0)
    with pytest.raises(Exception, match="coalescing must be"):
        rc.broadcast_view(coalescing="sometimes")
    view = rc.broadcast_view(coalescing=ipb.Batch(3, 0.01))
    assert view.apply_sync(lambda: 5) == [5] * len(rc)


# ----------------------------------------------------------------- auto mode
def test_auto_mode_rule(rc):
    view = rc.broadcast_view(coalescing="auto")
    before = rc._replies.received
    view.apply_sync(lambda: 1)  # blocking, small: coalesced into one message
    assert rc._replies.received - before == 1
    ar = view.apply_async(lambda: 1)  # not blocking: streamed
    assert ar._call.stream and ar.get(10) == [1] * len(rc)
    big = AUTO_STREAM_BYTES // len(rc) + 1024

    blob = lambda n: b"x" * n  # noqa: E731  (a lambda: sizes are known by code, not by name)
    first = view._apply(blob, None, (big,), block=True)  # first time: unknown size, coalesced
    assert not first._call.stream
    first.get(10)
    again = view._apply(blob, None, (big,), block=True)  # now known to be large: streamed
    assert again._call.stream
    again.get(10)
    other = view._apply(lambda: 1, None, block=True)  # another lambda: its own (small) size
    assert not other._call.stream
    other.get(10)


def test_auto_mode_remembers_a_bounded_number_of_functions(rc, monkeypatch):
    monkeypatch.setattr(view_module, "REPLY_SIZES_KEPT", 2)
    view = rc.broadcast_view(coalescing="auto")
    functions = [
        lambda: 1,
        lambda: 2,
        lambda: 3,
    ]  # one line each: known by where they are defined
    for f in functions:
        view.apply_sync(f)
    assert len(view._reply_sizes) == 2 and view.apply_sync(lambda: 4) == [4] * len(rc)


# ------------------------------------------------------ magics and datapub


def out_lines(text):
    """``(engine id, value)`` of each ``Out[engine:count]: value`` line, in order."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text)  # IPython colors the prompt
    return [(int(e), int(v)) for e, v in re.findall(r"Out\[(\d+):\d+\]: *(\d+)", plain)]


def test_px_magics_in_target_order(rc, coalescing, shell):
    from IPython.utils.io import capture_output

    targets = rc.ids[::-1]
    view = rc.broadcast_view(targets, coalescing=coalescing, block=True)
    view.scatter("rank", targets, flatten=True)
    view.activate("_t")
    with capture_output(display=False) as io:
        shell.run_cell_magic("px_t", "--no-stream", "print('rank', rank)\nrank * 10")
    assert [int(e) for e in re.findall(r"\[stdout:(\d+)\]", io.stdout)] == targets
    assert re.findall(r"rank (\d+)", io.stdout) == [str(t) for t in targets]
    assert out_lines(io.stdout) == [(t, 10 * t) for t in targets]

    with capture_output(display=False):
        shell.run_line_magic("autopx_t", "")
        shell.run_cell("doubled = rank * 2")
        shell.run_line_magic("autopx_t", "")
    assert view["doubled"] == [2 * t for t in targets]

    view.block = False
    with capture_output(display=False):
        shell.run_line_magic("px_t", "rank + 1")
    rc.wait(timeout=10)
    with capture_output(display=False) as io:
        shell.run_line_magic("pxresult_t", "")
    assert out_lines(io.stdout) == [(t, t + 1) for t in targets]


def test_publish_data(rc, coalescing):
    view = rc.broadcast_view(coalescing=coalescing)

    def publish():
        from ipyparallel.datapub import publish_data

        publish_data({"step": 1})
        return 1

    ar = view.apply_async(publish)
    assert ar.get(10) == [1] * len(rc)
    deadline = time.monotonic() + 10
    while not all(d.get("step") == 1 for d in ar.data) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [d.get("step") for d in ar.data] == [1] * len(rc)


def test_an_unreadable_reduction_reply_fails_its_call_and_leaves_no_segment(rc):
    from concurrent.futures import Future

    from ipyparallel_broadcast.wire import protocol as P

    before = {n for n in os.listdir("/dev/shm") if n.startswith("ipb-shm-")}
    state = {"op": "sum", "eids": [0]}
    cases = [
        ({"reduce": "nonsense"}, P.ProtocolError, "cannot be read"),
        (  # a segment that is not this client's: refused, not read
            {
                "parts": [0],
                "reduce": dict(
                    state,
                    value={
                        "t": "shm",
                        "dtype": "<f8",
                        "shape": [1],
                        "ref": {"name": "ipb-shm-0-1-x", "bufs": [[0, 4096, 8]]},
                    },
                ),
            },
            ipb.ReduceError,
            "not one value of this client's",
        ),
        (
            {"parts": [0], "reduce": dict(state, value={"t": "shm", "dtype": "<f8", "shape": [1], "ref": 3})},
            ipb.ReduceError,
            "malformed",
        ),
    ]
    for content, kind, words in cases:
        future = Future()
        future.targets = [0]  # (as the client's reduce future has them)
        rc._replies.reduced(future, {"content": content, "buffers": []})
        got = future.result(timeout=10)
        assert isinstance(got, kind) and words in str(got), got
    assert {n for n in os.listdir("/dev/shm") if n.startswith("ipb-shm-")} <= before


def test_what_a_reduces_engines_print_comes_with_its_value(rc):
    view = rc.broadcast_view(block=False)
    view.scatter("rank", rc.ids, flatten=True).get(timeout=60)

    def f():
        print(f"engine {rank}")  # noqa: F821
        return rank  # noqa: F821

    ar = view.reduce(ipp.interactive(f), op="sum")
    assert ar.get(timeout=60) == sum(range(len(rc)))
    assert ar.stdout == "".join(f"engine {r}\n" for r in range(len(rc)))  # in engine order, whatever came first
    quiet = view.reduce(ipp.interactive(lambda: rank), op="sum")  # noqa: F821
    assert quiet.get(timeout=60) == sum(range(len(rc))) and quiet.stdout == ""


def _segments() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("ipb-shm-")}


def _value_at_gate(gate, rank):
    import os
    import time

    import numpy as np

    while not os.path.exists(gate):
        time.sleep(0.02)
    return np.full(1 << 18, rank + 1.0)  # 2 MiB: through shared memory


def test_a_reduction_reply_after_its_call_failed_is_dropped_quietly_with_its_segment(rc, tmp_path, caplog):
    """The chaos runs found it: a reduction failed by name (its controller
    died) whose reply came after all was logged as an invalid reply, and
    the segment of its value was left behind."""
    view = rc.broadcast_view(block=False)
    view.scatter("rank", rc.ids, flatten=True, block=True)
    gate = tmp_path / "gate"
    segments = _segments()
    future = view.reduce(ipp.interactive(_value_at_gate), str(gate), ipp.Reference("rank"), op="sum")
    until(lambda: rc._root_watch.in_flight, what="the reduction in flight")
    rc._watch.fail_everything("failed by the test")
    with pytest.raises(Exception, match="failed by the test"):
        future.get(timeout=30)
    before = rc._replies.received
    caplog.clear()  # (the failure itself was logged)
    with caplog.at_level(logging.DEBUG, logger="ipyparallel_broadcast.client.replies"):
        gate.touch()
        until(lambda: rc._replies.received > before, what="the late reply")
        until(lambda: _segments() <= segments, what="no segment left")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert view.reduce(ipp.interactive(lambda: rank), op="sum").get(timeout=30) == sum(rc.ids)  # noqa: F821
