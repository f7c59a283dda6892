"""The hub's record store for broadcasts, without a hub."""

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ipyparallel_broadcast.controller import BroadcastController
from ipyparallel_broadcast.records import BroadcastDictDB

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def record(i, **extra):
    return dict(msg_id=f"m{i}", submitted=T0 + timedelta(seconds=i % 7), buffers=[], **extra)


def test_it_is_the_controllers_default_store():
    assert BroadcastController.class_traits()["db_class"].default_value is BroadcastDictDB


@given(st.integers(1, 40), st.integers(0, 200))
def test_culls_the_oldest_added_and_forgets_culled_ids_in_bounds(limit, n):
    db = BroadcastDictDB(record_limit=limit, cull_fraction=0.25)
    for i in range(n):
        db.add_record(f"m{i}", record(i))
    kept = list(db._records)
    assert len(kept) <= limit
    assert kept == [f"m{i}" for i in range(n - len(kept), n)]  # the newest, in order
    assert len(db._culled_ids) <= 10 * limit
    for i in range(n - len(kept)):  # culled: named as such while remembered
        if f"m{i}" in db._culled_ids:
            with pytest.raises(KeyError, match="culled"):
                db.get_record(f"m{i}")


def test_add_or_fill_keeps_what_came_first():
    db = BroadcastDictDB()
    db.add_or_fill("m1", record(1, stdout="early output", engine_uuid=None))
    db.add_or_fill("m1", record(1, stdout="", engine_uuid="u1", queue="broadcast"))
    rec = db.get_record("m1")
    assert (rec["stdout"], rec["engine_uuid"], rec["queue"]) == ("early output", "u1", "broadcast")


def test_instances_do_not_share_culled_ids():
    a, b = BroadcastDictDB(record_limit=1), BroadcastDictDB(record_limit=1)
    for i in range(3):
        a.add_record(f"m{i}", record(i))
    assert "m0" in a._culled_ids and "m0" not in b._culled_ids


@given(st.lists(st.integers(0, 5000), max_size=60), st.integers(1000, 20000))
def test_culls_by_buffer_size_too(sizes, size_limit):
    db = BroadcastDictDB(size_limit=size_limit, cull_fraction=0.5)
    for i, n in enumerate(sizes):
        db.add_record(f"m{i}", dict(record(i), buffers=[b"x" * n]))
        assert db._bytes == sum(len(r["buffers"][0]) for r in db._records.values())
        assert db._bytes <= size_limit
    if db._records:  # the newest survive
        assert list(db._records)[-1] == f"m{len(sizes) - 1}" or sizes[-1] > size_limit
