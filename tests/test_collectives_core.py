"""Scatter shares, batches and in-tree reduction in the pure core (no sockets)."""

import functools
import json
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from ipyparallel.serialize import serialize_object
from treesim import TreeSim, frames_bytes

from ipyparallel_broadcast.wire import bundles as B
from ipyparallel_broadcast.wire import protocol as P
from ipyparallel_broadcast.wire.reduction import OPS, ReduceError, Reduction, engine_value, ufunc

pytestmark = pytest.mark.pure

ENGINES = list(range(11))
shapes = st.tuples(st.integers(0, 3), st.integers(2, 4))
targets_st = st.lists(st.sampled_from(ENGINES), unique=True, min_size=1)


def own_buffers(eid):
    return [b"own-%d" % eid, b"more-%d" % eid] if eid % 2 else [b"own-%d" % eid]


# ------------------------------------------------------------------ scatter
@settings(max_examples=60, deadline=None)
@given(shapes, targets_st)
def test_each_engine_gets_shared_frames_and_only_its_own(shape, targets):
    sim = TreeSim(*shape, ENGINES)
    sim.request(targets, each=[own_buffers(e) for e in targets])
    replies, failures, n_messages = sim.outcomes()
    assert sorted(replies) == sorted(targets) and not failures and n_messages == 1
    for eid in targets:
        (frames,) = sim.engine_inbox[eid]
        got = frames_bytes(frames)
        assert got[-len(own_buffers(eid)) :] == own_buffers(eid)
        assert got[-len(own_buffers(eid)) - 1] == b"payload"  # the shared frame
    assert sim.pending_total() == 0


@settings(max_examples=60, deadline=None)
@given(shapes, targets_st)
def test_each_hop_carries_only_its_subtrees_share(shape, targets):
    sim = TreeSim(*shape, ENGINES)
    sim.request(targets, each=[own_buffers(e) for e in targets])
    for path, inbox in sim.node_inbox.items():
        served = [e for e in targets if sim.shape.serves(path, e)]
        expected = sorted(b for e in served for b in own_buffers(e))
        carried = sorted(b for frames in inbox for b in frames_bytes(frames) if b[:4] in (b"own-", b"more"))
        assert carried == expected, path


def test_each_must_match_targets():
    sim = TreeSim(1, 2, ENGINES)
    sim.request([0, 1], each=[[b"a"]])  # one count for two targets
    root = sim.nodes[()]
    assert root.dropped == 1 and not root.pending and not sim.client_inbox


# ------------------------------------------------------------------ batches
@settings(max_examples=60, deadline=None)
@given(shapes, targets_st, st.integers(1, 5))
def test_batches_of_k_per_leaf(shape, targets, k):
    sim = TreeSim(*shape, ENGINES)
    sim.request(targets, stream=True, batch=[k, None])
    replies, failures, n_messages = sim.outcomes()
    assert sorted(replies) == sorted(targets) and not failures
    per_leaf = {}
    for e in targets:
        per_leaf[sim.shape.leaf_of(e)] = per_leaf.get(sim.shape.leaf_of(e), 0) + 1
    assert n_messages == sum(-(-n // k) for n in per_leaf.values())
    assert sim.pending_total() == 0


def bundle_eids(frames):
    """The engines a streamed bundle covers (its metadata, read without the codec)."""
    _, body = P.split_idents(frames)
    return json.loads(P.as_bytes(body[3]))["eids"]


def test_batch_interval_sends_what_arrived():
    sim = TreeSim(0, 2, [0, 1, 2, 3])
    sim.hold.update({2, 3})
    sim.request([0, 1, 2, 3], stream=True, batch=[10, 0.5])
    assert sim.nodes[()].next_deadline() == 0.5
    sim.tick(0.25)
    assert not sim.client_inbox  # interval not over yet
    sim.tick(0.25)
    assert [bundle_eids(f) for f in sim.client_inbox] == [[0, 1]]
    assert sim.nodes[()].next_deadline() is None
    sim.release(2)
    sim.kill(3)  # a failure completes the request: the rest goes up at once
    assert [bundle_eids(f) for f in sim.client_inbox] == [[0, 1], [2, 3]]
    replies, failures, n_messages = sim.outcomes()
    assert sorted(replies) == [0, 1, 2] and sorted(failures) == [3] and n_messages == 2
    assert sim.pending_total() == 0


@pytest.mark.parametrize("batch", [[0, None], [2, -1], [2, "soon"], [True, 1]])
def test_bad_batches_are_dropped(batch):
    sim = TreeSim(1, 2, ENGINES)
    sim.request([0, 1], stream=True, batch=batch)
    assert sim.nodes[()].dropped == 1 and not sim.client_inbox


# ------------------------------------------------------------------- reduce
def value_answer(values):
    """Engines answer with ``engine_value`` buffers of ``values[eid]``."""

    def answer(eid, request):
        return {"status": "ok"}, serialize_object(engine_value(lambda: values[eid]))

    return answer


def reduce_outcome(sim):
    (frames,) = sim.client_inbox
    msg = sim.codec.unpack(P.split_idents(frames)[1])
    state, value, raised, failed = B.reduced_parts(msg)
    r = Reduction(state["op"])
    r.add_partial(state, value)
    return r, raised, failed


dtypes = st.sampled_from(["int8", "int32", "uint16", "int64", "float32", "float64", "complex128"])


@settings(max_examples=80, deadline=None)
@given(
    shapes,
    targets_st,
    st.sampled_from(sorted(OPS)),
    dtypes,
    hnp.array_shapes(min_dims=0, max_dims=3, max_side=4),
    st.data(),
)
def test_tree_reduce_equals_combining_gathered_results(shape, targets, op, dtype, ashape, data):
    # small integer-valued elements: every combination order gives exact results
    low = 0 if dtype.startswith("u") else -4
    values = {e: data.draw(hnp.arrays(dtype, ashape, elements=st.integers(low, 4))) for e in targets}
    sim = TreeSim(*shape, ENGINES)
    sim.answer_with = value_answer(values)
    sim.request(targets, reduce=op)
    r, raised, failed = reduce_outcome(sim)
    expected = functools.reduce(ufunc(op), [values[e] for e in targets])
    result = r.result()
    assert result.dtype == expected.dtype and result.shape == expected.shape
    np.testing.assert_array_equal(result, expected)
    assert sorted(r.eids) == sorted(targets) and not raised and not failed
    assert sim.pending_total() == 0


@settings(max_examples=40, deadline=None)
@given(shapes, targets_st, st.sampled_from(sorted(OPS)), st.data())
def test_tree_reduce_of_python_numbers(shape, targets, op, data):
    values = {
        e: data.draw(st.one_of(st.integers(-(10**20), 10**20), st.floats(-1e3, 1e3), st.booleans())) for e in targets
    }
    sim = TreeSim(*shape, ENGINES)
    sim.answer_with = value_answer(values)
    sim.request(targets, reduce=op)
    r, _, _ = reduce_outcome(sim)
    ordered = [values[e] for e in targets]
    expected = functools.reduce(OPS[op][1], ordered)
    if any(type(v) is float for v in ordered) and op in ("sum", "prod"):
        assert r.result() == pytest.approx(expected, rel=1e-9)
    else:
        assert r.result() == expected


def test_mismatched_shapes_name_the_engines():
    values = {0: np.zeros(3), 1: np.zeros(3), 2: np.zeros(4), 3: np.zeros(3)}
    sim = TreeSim(1, 2, list(values))
    sim.answer_with = value_answer(values)
    sim.request(list(values), reduce="sum")
    r, _, _ = reduce_outcome(sim)
    with pytest.raises(ReduceError) as info:
        r.result()
    message = str(info.value)
    assert "[2]" in message and "shape (4,)" in message and "shape (3,)" in message


def test_mismatched_dtypes_and_kinds():
    for values in ({0: np.zeros(2, "int32"), 1: np.zeros(2, "float32")}, {0: 1, 1: np.float64(1)}):
        sim = TreeSim(0, 2, list(values))
        sim.answer_with = value_answer(values)
        sim.request(list(values), reduce="max")
        r, _, _ = reduce_outcome(sim)
        with pytest.raises(ReduceError, match=r"engines \[0\] gave .* engines \[1\] gave"):
            r.result()


class Evil:
    def __reduce__(self):
        return (print, ("code ran in a relay node",))


class Stranger:  # pickled by class and state (NEWOBJ, BUILD), as CannedArray is
    pass


@pytest.mark.parametrize(
    "value, why",
    [
        (Evil(), "pickle opcode REDUCE is not allowed"),  # refused before loading
        (Stranger(), "refused to load .*Stranger"),  # refused by the unpickler
    ],
)
def test_no_code_runs_in_the_tree(capsys, value, why):
    """A value that would run code, or make an object of a class but ours,
    when unpickled is refused, naming the engine."""

    def answer(eid, request):
        if eid == 1:
            return {"status": "ok"}, [pickle.dumps(("py", value))]
        return {"status": "ok"}, serialize_object(engine_value(lambda: 2))

    sim = TreeSim(1, 2, [0, 1, 2])
    sim.answer_with = answer
    sim.request([0, 1, 2], reduce="sum")
    r, _, _ = reduce_outcome(sim)
    with pytest.raises(ReduceError, match=f"engine 1 .*{why}"):
        r.result()
    assert "code ran" not in capsys.readouterr().out
    assert sim.pending_total() == 0


@pytest.mark.parametrize(
    "value, why",
    [
        (("xx", "<f8", [1], False, None), "unknown kind 'xx'"),
        (("nd", "<f8", [1], False, b"\0" * 8), "not one raw byte buffer"),
    ],
)
def test_malformed_engine_values_are_refused_by_name(value, why):
    """Checked by code, not ``assert`` (which ``python -O`` removes)."""

    def answer(eid, request):
        if eid == 1:
            return {"status": "ok"}, [pickle.dumps(value)]
        return {"status": "ok"}, serialize_object(engine_value(lambda: 2.0))

    sim = TreeSim(1, 2, [0, 1, 2])
    sim.answer_with = answer
    sim.request([0, 1, 2], reduce="sum")
    r, _, _ = reduce_outcome(sim)
    with pytest.raises(ReduceError, match=f"engine 1 .*{why}"):
        r.result()
    assert sim.pending_total() == 0


def test_raised_engines_go_up_raw_and_others_still_combine():
    def answer(eid, request):
        if eid == 3:
            return {"status": "error", "ename": "ZeroDivisionError", "evalue": "x", "traceback": []}, []
        return {"status": "ok"}, serialize_object(engine_value(lambda: eid))

    sim = TreeSim(2, 2, list(range(6)))
    sim.answer_with = answer
    sim.request(list(range(6)), reduce="sum")
    r, raised, failed = reduce_outcome(sim)
    assert r.result() == 0 + 1 + 2 + 4 + 5
    (body,) = raised
    assert sim.codec.unpack(body)["content"]["ename"] == "ZeroDivisionError"


def test_reduce_with_dead_engine():
    sim = TreeSim(1, 2, [0, 1, 2, 3])
    sim.answer_with = value_answer({e: e for e in range(4)})
    sim.hold.add(2)
    sim.request([0, 1, 2, 3], reduce="sum")
    sim.kill(2)
    r, raised, failed = reduce_outcome(sim)
    assert r.result() == 0 + 1 + 3 and [f[0] for f in failed] == [2]
    assert sim.pending_total() == 0


@pytest.mark.parametrize("bad", [dict(reduce="mean"), dict(reduce="sum", stream=True)])
def test_bad_reduce_requests_are_dropped(bad):
    sim = TreeSim(1, 2, [0, 1])
    sim.request([0, 1], **bad)
    assert sim.nodes[()].dropped == 1 and not sim.client_inbox


@pytest.mark.parametrize("packer", ["json", "orjson"])
def test_python_numbers_travel_exactly_whichever_json_packer(packer):
    """orjson (jupyter_client's default packer when installed) reads an int
    past 64 bits as a float: a combined value's header must not hold one."""
    from jupyter_client.session import Session

    from ipyparallel_broadcast.wire.reduction import decode, encode

    session = Session(packer=packer, unpacker=packer)
    for value in (2**70, -(2**63) - 1, 10**20, 7, True, 1.5, -0.0):
        header, frames = encode(value)
        back = decode(session.unpack(session.pack(header)), frames)
        assert back == value and type(back) is type(value)


# ------------------------------------------------------------ combine order
def _float_sum_in_arrival_order(shape, targets, values, order, hosts=None):
    sim = TreeSim(*shape, ENGINES, hosts=hosts)
    sim.answer_with = value_answer(values)
    sim.request_answered_in(order, targets, reduce="sum")
    r, raised, failed = reduce_outcome(sim)
    assert not raised and not failed and sim.pending_total() == 0
    return r.result()


@settings(max_examples=60, deadline=None)
@given(shapes, targets_st, st.randoms(use_true_random=False), st.data())
def test_a_float_sum_is_bitwise_the_same_whatever_order_replies_come_in(shape, targets, rng, data):
    # magnitudes far apart: a different combine order gives a different float
    floats = st.floats(-1e16, 1e16, allow_nan=False) | st.sampled_from([1.0, 1e-3, 3.3e15])
    values = {e: np.array([data.draw(floats) for _ in range(3)]) for e in targets}
    first, second = list(targets), list(targets)
    rng.shuffle(first)
    rng.shuffle(second)
    a = _float_sum_in_arrival_order(shape, targets, values, first)
    b = _float_sum_in_arrival_order(shape, targets, values, second)
    assert a.tobytes() == b.tobytes()


def test_host_relays_combine_in_the_same_fixed_order():
    values = {e: np.array([[1e16, 1.0, -1e16, 3.0, 2.5e-7, 7e15][e % 6]]) for e in range(8)}
    hosts = {"a": (0, [2, 4, 6]), "b": (1, [3, 5])}
    orders = [list(range(8)), list(range(7, -1, -1)), [5, 0, 6, 3, 1, 7, 2, 4]]
    results = {_float_sum_in_arrival_order((1, 2), list(range(8)), values, o, hosts).tobytes() for o in orders}
    assert len(results) == 1


def test_values_in_their_turn_are_combined_at_once_and_others_wait():
    """A node holds only the values that came before their turn."""
    sim = TreeSim(0, 2, [0, 1, 2, 3])
    sim.answer_with = value_answer({e: np.full(4, float(e)) for e in range(4)})
    sim.hold.update(range(4))
    sim.request([0, 1, 2, 3], reduce="sum")
    (p,) = sim.nodes[()].pending.values()
    sim.release(0)
    sim.release(1)
    assert p.reduction.waiting == 0
    sim.release(3)
    assert p.reduction.waiting == 1  # engine 3 waits for engine 2
    sim.release(2)
    r, _, _ = reduce_outcome(sim)
    np.testing.assert_array_equal(r.result(), np.full(4, 6.0))


def test_a_raised_engine_does_not_hold_back_the_values_after_it():
    def answer(eid, request):
        if eid == 1:
            return {"status": "error", "ename": "ValueError", "evalue": "x", "traceback": []}, []
        return {"status": "ok"}, serialize_object(engine_value(lambda: np.ones(2)))

    sim = TreeSim(0, 2, [0, 1, 2, 3])
    sim.answer_with = answer
    sim.hold.update(range(4))
    sim.request([0, 1, 2, 3], reduce="sum")
    (p,) = sim.nodes[()].pending.values()
    sim.release(2)
    sim.release(0)
    assert p.reduction.waiting == 1  # engine 2 waits for engine 1
    sim.release(1)  # raised: its turn passes
    assert p.reduction.waiting == 0
    sim.release(3)
    r, raised, _ = reduce_outcome(sim)
    np.testing.assert_array_equal(r.result(), np.full(2, 3.0))
    assert len(raised) == 1


# ------------------------------------------------------------ allreduce
class Engines:
    """Fake engines for an allreduce: each gives its value to the reduce, and
    keeps what the root's second request binds (``bound``)."""

    def __init__(self, values, raises=()):
        self.values, self.raises, self.bound = values, set(raises), {}

    def __call__(self, eid, request):
        from ipyparallel.serialize import unpack_apply_message

        f, args = None, ()
        if len(request["buffers"]) >= 2:  # the root's request (the sim's own carries one buffer)
            f, args, _ = unpack_apply_message(request["buffers"])
        if getattr(f, "__name__", None) == "assign":
            name, value = args
            self.bound.setdefault(eid, []).append((name, value, request["header"]["msg_id"]))
            return {"status": "ok"}, serialize_object(("py", 1))
        if eid in self.raises:
            return {"status": "error", "ename": "ValueError", "evalue": "no", "traceback": []}, []
        return {"status": "ok"}, serialize_object(engine_value(lambda: self.values[eid]))


@settings(max_examples=40, deadline=None)
@given(shapes, targets_st, st.sampled_from(sorted(OPS)))
def test_allreduce_binds_the_combined_value_in_every_engine_and_tells_the_client_how_many(shape, targets, op):
    values = {e: np.arange(3.0) * (e + 1) for e in targets}
    engines = Engines(values)
    sim = TreeSim(*shape, ENGINES)
    sim.answer_with = engines
    msg_id = sim.request(targets, reduce=op, allreduce="total")
    expected = functools.reduce(ufunc(op), [values[e] for e in sorted(targets)])
    assert sorted(engines.bound) == sorted(targets)
    for eid in targets:
        ((name, value, parent),) = engines.bound[eid]  # once each
        assert name == "total" and parent == msg_id
        np.testing.assert_array_equal(value, expected)
    r, raised, failed = reduce_outcome(sim)  # one message to the client: the count
    assert r.result() == len(targets) and not raised and not failed
    assert sim.pending_total() == 0


def test_allreduce_with_an_engine_that_raised_binds_nothing():
    engines = Engines({e: e for e in range(6)}, raises=[4])
    sim = TreeSim(1, 2, list(range(6)))
    sim.answer_with = engines
    sim.request(list(range(6)), reduce="sum", allreduce="total")
    r, raised, failed = reduce_outcome(sim)
    assert not engines.bound and len(raised) == 1 and r.result() == 0 + 1 + 2 + 3 + 5
    assert sim.pending_total() == 0


def test_allreduce_of_values_that_do_not_combine_binds_nothing():
    engines = Engines({0: np.zeros(2), 1: np.zeros(3)})
    sim = TreeSim(0, 2, [0, 1])
    sim.answer_with = engines
    sim.request([0, 1], reduce="max", allreduce="m")
    r, _, _ = reduce_outcome(sim)
    assert not engines.bound
    with pytest.raises(ReduceError, match="shape"):
        r.result()


def test_allreduce_with_an_engine_dead_before_it_answered_binds_nothing():
    engines = Engines({e: e for e in range(4)})
    sim = TreeSim(1, 2, [0, 1, 2, 3])
    sim.answer_with = engines
    sim.hold.add(2)
    sim.request([0, 1, 2, 3], reduce="sum", allreduce="total")
    sim.kill(2)
    r, _, failed = reduce_outcome(sim)
    assert not engines.bound and [f[0] for f in failed] == [2]
    assert sim.pending_total() == 0


def test_allreduce_with_an_engine_dead_before_it_bound_names_it_and_the_others_have_the_value():
    engines = Engines({e: e + 1 for e in range(4)})
    sim = TreeSim(1, 2, [0, 1, 2, 3])
    sim.answer_with = engines
    receive = sim._engine_receive

    def second_request_to_3_waits(leaf_path, frames):
        if P.as_bytes(frames[0]).decode() == sim.engines.get(3) and sim.engine_inbox[3]:
            sim.hold.add(3)
        receive(leaf_path, frames)

    sim._engine_receive = second_request_to_3_waits
    sim.request([0, 1, 2, 3], reduce="sum", allreduce="total")
    assert len(sim.engine_inbox[3]) == 2 and not sim.client_inbox
    sim.kill(3)
    r, raised, failed = reduce_outcome(sim)
    assert [f[0] for f in failed] == [3] and r.result() == 3 and not raised
    assert sorted(engines.bound) == [0, 1, 2] and all(v[0][1] == 10 for v in engines.bound.values())
    assert sim.pending_total() == 0


@pytest.mark.parametrize("name", ["", "1x", "a b", 7])
def test_allreduce_requests_without_a_proper_name_are_dropped(name):
    sim = TreeSim(1, 2, [0, 1])
    sim.request([0, 1], reduce="sum", allreduce=name)
    assert sim.nodes[()].dropped == 1 and not sim.client_inbox


def test_allreduce_needs_a_reduce():
    sim = TreeSim(1, 2, [0, 1])
    sim.request([0, 1], allreduce="x")
    assert sim.nodes[()].dropped == 1 and not sim.client_inbox


@pytest.mark.parametrize("op", sorted(OPS))
def test_big_arrays_combined_on_several_threads_are_the_same_to_the_bit(op):
    from ipyparallel_broadcast.wire.reduction import PARALLEL_FROM, combine_into

    rng = np.random.default_rng(3)
    n = PARALLEL_FROM // 8 + 12345  # over the threshold, not a multiple of the slices
    a, b = rng.random(n), rng.random(n) * 1e9
    expected = ufunc(op)(a, b)
    combine_into(ufunc(op), a, b)
    assert a.tobytes() == expected.tobytes()


def test_an_allreduce_whose_value_the_root_cannot_send_down_fails_with_the_reason(monkeypatch):
    from ipyparallel_broadcast.relay import down

    def broken(*args):
        raise RuntimeError("no pickling today")

    monkeypatch.setattr(down, "assign_request", broken)
    engines = Engines({e: e for e in range(4)})
    sim = TreeSim(1, 2, [0, 1, 2, 3])
    sim.answer_with = engines
    sim.request([0, 1, 2, 3], reduce="sum", allreduce="total")
    r, _, _ = reduce_outcome(sim)
    assert not engines.bound and sim.pending_total() == 0
    with pytest.raises(ReduceError, match="could not send the value down: no pickling today"):
        r.result()


def test_a_reduce_carries_what_its_engines_printed_beside_its_value():
    from jupyter_client.session import Session

    from ipyparallel_broadcast.wire.reduction import fold_reply

    session = Session(key=b"k")
    codec = P.Codec(session)
    r = Reduction("sum")
    printed = {0: {"stdout": "a\n", "stderr": "", "outputs": []}, 1: {"stdout": "", "stderr": "", "outputs": []}}
    for eid in (1, 0):
        msg = session.msg("apply_reply", content={"status": "ok"}, metadata={P.OUTPUTS_KEY: printed[eid]})
        body = session.serialize(msg)[1:] + serialize_object(engine_value(lambda eid=eid: eid))
        assert fold_reply(r, [eid], body, codec)
    state, frames = r.state()
    assert state["outputs"] == {"0": {"stdout": "a\n"}}  # only what printed, and only what it printed
    up = Reduction("sum")
    up.add_partial(state, frames)
    up.add_partial(dict(op="sum", eids=[2], value=None, error=None, outputs={"2": {"stderr": "b"}, "3": "junk"}), [])
    assert up.result() == 1 and up.outputs == {"0": {"stdout": "a\n"}, "2": {"stderr": "b"}}


def test_a_traced_allreduce_keeps_both_halves_at_the_root_each_with_its_time():
    sim = TreeSim(1, 2, [0, 1, 2, 3])
    sim.answer_with = Engines({e: e for e in range(4)})
    msg_id = sim.request([0, 1, 2, 3], reduce="sum", allreduce="total", trace=True)
    events = sim.nodes[()].stats(trace=msg_id)["trace"]
    assert [e[0] for e in events].count("request in") == 2  # the reduce, then the bind
    assert all(isinstance(e[1], float) for e in events)
