"""The alpha-beta model of broadcasts between hosts: no estimate beats the
lower bound, the chunk count it picks is the best one, and the shapes it
prefers change with the size as MPI's algorithms do."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ipyparallel_broadcast.relay.dataplane.model import Link, best, candidates, depth_of, mpi_bounds, pipeline, predict

pytestmark = pytest.mark.pure

links = st.builds(Link, alpha=st.floats(1e-6, 1e-2), beta=st.floats(1e-11, 1e-7))


@settings(max_examples=200, deadline=None)
@given(p=st.integers(2, 5000), m=st.floats(1, 2**32), link=links)
def test_no_estimate_beats_the_lower_bound(p, m, link):
    bound = mpi_bounds(p, m, link)["lower bound"]
    for e in candidates(p, m, link):
        assert e.seconds >= bound * (1 - 1e-9), e


@settings(max_examples=200, deadline=None)
@given(stages=st.integers(1, 200), work=st.floats(1e-6, 10), alpha=st.floats(1e-6, 1e-2))
def test_the_chunk_count_is_the_best_whole_one(stages, work, alpha):
    seconds, chunks = pipeline(stages, work, alpha)
    brute = min((stages + s - 1) * (alpha + work / s) for s in range(1, 4 * chunks + 2))
    assert seconds <= brute * 1.0001 + 1e-12


def test_depth_counts_the_levels_below_the_root():
    assert [depth_of(p, 2) for p in (1, 2, 3, 6, 7)] == [1, 1, 2, 2, 3]
    assert depth_of(10, 1) == 10


def test_small_messages_take_few_hops_and_big_ones_pipeline_with_one_copy_from_the_root():
    link = Link.of(2e-4, 10e9)
    small, big = best(1000, 1024, link), best(1000, 2**30, link)
    assert small.chunks == 1 and small.seconds < 0.01
    assert big.chunks > 1 and big.root_copies == 1
    assert big.seconds <= 1.5 * 2**30 * link.beta  # the target at 1,000 hosts


def test_the_predicted_table_has_every_family_in_floors():
    (row,) = predict(hosts=(100,))
    assert row["star"][0] == pytest.approx(100, rel=1e-3)  # a copy per host through the root's link
    assert 1 <= row["two trees"][0] < row["pipelined tree"][0] < row["tree"][0] < row["star"][0]
    assert row["lower bound"] < row["MPICH scatter + allgather"]
    assert math.isclose(row["floor"], 2**30 * 8 / 10e9)


@pytest.mark.parametrize("p", [2, 8, 100, 1000, 10000])
def test_every_way_of_reducing_and_allreducing_is_at_least_its_lower_bound(p):
    from ipyparallel_broadcast.relay.dataplane.model import predict_collectives

    (row,) = predict_collectives([p])
    assert all(v >= 1 - 1e-9 for k, v in row.items() if k != "hosts"), row


def test_two_trees_reduce_and_allreduce_within_half_again_their_bounds_at_a_thousand_hosts():
    from ipyparallel_broadcast.relay.dataplane.model import TEN_GBIT, collective_bounds, predict_collectives

    (row,) = predict_collectives([1000], 2**30, TEN_GBIT)
    assert row["reduce: two trees"] <= 1.5 and row["allreduce: two trees, overlapped"] <= 1.5
    assert row["reduce: chain"] > 2  # one message per hop a thousand times over: the chain's latency
    bounds = collective_bounds(1000, 2**30, TEN_GBIT)
    assert bounds["MPICH reduce"] == pytest.approx(2 * bounds["reduce lower bound"], rel=0.01)
