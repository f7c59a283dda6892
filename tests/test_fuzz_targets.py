"""The fuzz targets (``tools/fuzz/targets.py``) on a fixed number of inputs
each: valid seeds, their mutations and random bytes (hypothesis, derandomized),
then every input kept in ``tests/fuzz_corpus/<target>/``, which holds what the
long runs found (``benchmarks/scripts/fuzz.py``) as regression inputs. A
target fails if the code under test raises what it must not, or does what it
must not (loads a class, runs code)."""

import io
import os
import pickle

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ipyparallel_broadcast.tools.fuzz import targets as T
from ipyparallel_broadcast.wire import reduction, unpickle

pytestmark = pytest.mark.pure

INPUTS = 400  # per target, in the suite (the long runs: benchmarks/scripts/fuzz.py)
CORPUS = os.path.join(os.path.dirname(__file__), "fuzz_corpus")
SEEDS = T.seeds()


def mutate(seed: bytes, edits) -> bytes:
    """``seed`` with ``edits`` applied: (position, new bytes, how many to drop)."""
    data = bytearray(seed)
    for at, insert, drop in edits:
        at = at % (len(data) + 1)
        data[at : at + drop] = insert
    return bytes(data)


def inputs(name):
    edits = st.lists(st.tuples(st.integers(0, 1 << 16), st.binary(max_size=8), st.integers(0, 8)), max_size=6)
    return st.one_of(st.binary(max_size=512), st.builds(mutate, st.sampled_from(SEEDS[name]), edits))


def corpus(name) -> list[bytes]:
    folder = os.path.join(CORPUS, name)
    if not os.path.isdir(folder):
        return []
    return [open(os.path.join(folder, f), "rb").read() for f in sorted(os.listdir(folder))]


@pytest.mark.parametrize("name", sorted(T.TARGETS))
def test_each_target_takes_its_seeds_and_kept_inputs(name):
    for data in SEEDS[name] + corpus(name):
        T.TARGETS[name](data)


@pytest.mark.parametrize("name", sorted(T.TARGETS))
def test_each_target_takes_fuzzed_inputs(name):
    target = T.TARGETS[name]

    @settings(
        max_examples=INPUTS,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(inputs(name))
    def run(data):
        target(data)

    run()


def test_a_forged_reduce_pickle_runs_no_code_of_cannedarray():
    """REDUCE on CannedArray would call its ``__init__`` (code, on attacker
    data); the unpickler hands out a class without one."""
    canned = unpickle.canned_array_class()
    forged = b"\x80\x04cipyparallel.serialize.canning\nCannedArray\n(X\x03\x00\x00\x00abctR."
    with pytest.raises(AttributeError):
        pickle.loads(forged)  # the stock class runs its code on it
    loaded = unpickle.ValueUnpickler(io.BytesIO(forged)).load()
    assert type(loaded) is unpickle.inert_canned_array() and isinstance(loaded, canned)
    assert loaded.__dict__ == {}

    class Forged:  # pickles as CannedArray("abc"): REDUCE
        def __reduce__(self):
            return canned, ("abc",)

    with pytest.raises(ValueError, match="not a reduce value"):
        reduction.decode_engine([pickle.dumps(("nd", "<f8", [1], False, Forged()))])


def test_the_unpickler_target_catches_code_that_runs(monkeypatch):
    """With the stock class handed out and no opcode check (as before), the forged pickle runs
    ``CannedArray.__init__``, and the target says so."""
    forged = b"\x80\x04cipyparallel.serialize.canning\nCannedArray\n(X\x03\x00\x00\x00abctR."
    monkeypatch.setattr(unpickle, "inert_canned_array", unpickle.canned_array_class)
    monkeypatch.setattr(unpickle, "check", lambda data: None)
    with pytest.raises(T.Finding, match="CannedArray code ran"):
        T.reduce_value(forged)


def test_a_memo_index_past_the_pickle_is_refused_before_loading():
    """Found by the fuzzer: 7 bytes that made CPython's unpickler size its memo
    for 780 million entries (gigabytes, in a relay)."""
    forged = b"}r\xb4\xfey."
    with pytest.raises(ValueError, match="memo index"):
        unpickle.check(forged)
    with pytest.raises(ValueError, match="not a reduce value"):
        reduction.decode_engine([forged])


@pytest.mark.parametrize(
    "value", [1, -(10**30), 2.5, True, "array", "scalar", "empty", "complex"], ids=lambda v: str(v)[:8]
)
def test_every_value_engines_send_passes_the_check(value):
    import numpy as np
    from ipyparallel.serialize import serialize_object

    made = dict(
        array=np.arange(6.0).reshape(2, 3), scalar=np.float32(2), empty=np.zeros((0, 3)), complex=np.complex64(1 + 2j)
    )
    value = made.get(value, value) if isinstance(value, str) else value
    buffers = serialize_object(reduction.engine_value(lambda: value))
    unpickle.check(bytes(buffers[0]))
    np.testing.assert_array_equal(reduction.decode_engine(buffers), value)
