"""The engine's apply, without sockets: functions unpickled once when that is
safe, calls unpacked as ipyparallel unpacks them, errors made into content."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ipyparallel.serialize import pack_apply_message, serialize_object, unpack_apply_message
from ipyparallel.serialize.serialize import deserialize_object

from ipyparallel_broadcast.engine.applycall import Functions, reusable, run_apply, serialize_result, unpack_call

pytestmark = pytest.mark.pure


def plain(x, y=2, *, z="z"):
    return x + y


def defaults_mutable(x, acc=[]):  # noqa: B006 (the point of the test)
    acc.append(x)
    return list(acc)


def closure_over(state):
    def inner(x):
        state.append(x)
        return len(state)

    return inner


def test_only_functions_a_call_cannot_change_are_reusable():
    assert reusable(plain)
    assert reusable(lambda: 1)
    assert not reusable(defaults_mutable)
    assert not reusable(closure_over([]))
    assert not reusable(print)  # not a Python function
    tagged = lambda: 1  # noqa: E731
    tagged.tag = 1
    assert not reusable(tagged)


def _call(functions, f, *args, **kwargs):
    bufs = pack_apply_message(f, args, kwargs)
    g = {}
    f2, args2, kwargs2 = unpack_call([memoryview(b) for b in bufs], g, functions)
    return f2(*args2, **kwargs2), f2


def test_a_reusable_function_is_unpickled_once():
    functions = Functions()
    (r1, f1), (r2, f2) = _call(functions, plain, 1), _call(functions, plain, 5, y=1)
    assert (r1, r2) == (3, 6)
    assert f1 is f2
    assert (functions.misses, functions.hits) == (1, 1)


def test_mutable_state_is_never_shared_between_calls():
    functions = Functions()
    assert _call(functions, defaults_mutable, 1)[0] == [1]
    assert _call(functions, defaults_mutable, 2)[0] == [2]  # a fresh default, as ipyparallel's
    f = closure_over([])
    assert _call(functions, f, 1)[0] == 1
    assert _call(functions, f, 1)[0] == 1
    assert functions.hits == 0


def tags_itself(f):
    f.calls = getattr(f, "calls", 0) + 1
    return f.calls


def test_a_function_that_gains_attributes_is_unpickled_again():
    functions = Functions()
    bufs = [memoryview(b) for b in pack_apply_message(lambda: 0, (), {})]
    f1, _ = functions.load(bufs, {})
    assert tags_itself(f1) == 1  # what a call might do to its own function
    f2, _ = functions.load(bufs, {})
    assert f2 is not f1 and tags_itself(f2) == 1  # as a fresh unpickle: nothing carried over


def test_the_cache_is_bounded():
    functions = Functions(size=3)
    for k in range(10):
        _call(functions, eval(f"lambda: {k}"))
    assert len(functions._kept) == 3


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.one_of(st.integers(), st.text(max_size=20), st.floats(allow_nan=False), st.lists(st.integers(), max_size=5)),
        max_size=4,
    ),
    st.dictionaries(st.sampled_from("abc"), st.integers(), max_size=3),
    st.integers(0, 3000),
)
def test_unpacked_as_ipyparallel_unpacks(args, kwargs, n):
    args = args + [np.arange(n)]  # large enough, and the array travels as its own buffer
    bufs = [memoryview(b) for b in pack_apply_message(plain, args, kwargs)]
    ours = unpack_call(bufs, {}, Functions())
    theirs = unpack_apply_message(bufs, {}, copy=False)
    assert ours[1][:-1] == theirs[1][:-1] and ours[2] == theirs[2]
    assert np.array_equal(ours[1][-1], theirs[1][-1])


def test_errors_become_content_and_results_buffers():
    functions = Functions()
    bufs = pack_apply_message(lambda x: 1 / x, (0,), {})
    content, result = run_apply(bufs, {}, functions, 1024, 64, lambda e: dict(status="error", ename=type(e).__name__))
    assert content == dict(status="error", ename="ZeroDivisionError") and result == []
    content, result = run_apply(
        pack_apply_message(lambda x: x * 2, (np.ones(1000),), {}),
        {},
        functions,
        1024,
        64,
        lambda e: pytest.fail(str(e)),
    )
    assert content == {"status": "ok"} and len(result) == 2  # the pickle, and the array's data
    content, _ = run_apply(bufs[:1], {}, functions, 1024, 64, lambda e: dict(status="error", ename=type(e).__name__))
    assert content["ename"] == "ValueError"


@given(
    st.one_of(
        st.binary(max_size=3000),
        st.integers(),
        st.text(max_size=50),
        st.lists(st.binary(max_size=1500), max_size=4),
        st.dictionaries(st.sampled_from("abc"), st.binary(max_size=1500), max_size=3),
    )
)
def test_results_read_back_as_ipyparallel_reads_them(value):
    """Any ipyparallel client's ``deserialize_object`` reads our result buffers
    as it reads ``serialize_object``'s: same value, same type, same number of
    frames (a large buffer still goes as a frame of its own)."""
    ours, theirs = serialize_result(value, 1024, 64), serialize_object(value, 1024, 64)
    assert len(ours) == len(theirs)
    back = deserialize_object([memoryview(b) for b in ours])[0]
    assert back == deserialize_object(theirs)[0] == value and type(back) is type(value)


def test_small_bytes_results_are_pickled_as_bytes_not_canned():
    """The point of ``serialize_result``: a small ``bytes`` unpickles as
    ``bytes`` (no ``CannedBytes`` instance to make); up to the threshold, as
    ipyparallel's extraction counts it (``> threshold`` goes alone)."""
    import pickle

    assert pickle.loads(serialize_result(b"x" * 1024, 1024, 64)[0]) == b"x" * 1024
    assert type(pickle.loads(serialize_object(b"x" * 1024, 1024, 64)[0])).__name__ == "CannedBytes"
    assert len(serialize_result(b"x" * 1025, 1024, 64)) == 2
