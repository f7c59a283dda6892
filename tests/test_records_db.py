"""The hub's record store for broadcasts, without a hub."""

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ipyparallel_broadcast.controller.app import BroadcastController
from ipyparallel_broadcast.controller.records import BroadcastDictDB

pytestmark = pytest.mark.pure

T0 = datetime(2026, 1, 1, tzinfo=UTC)


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


# --------------------------------------------------------- the copies' journal
class HubStandIn:
    """What BroadcastRecords reads of a hub: its store, session and log (the
    hooks that hand it the hub's traffic: ``test_hubhooks``)."""

    def __init__(self, db):
        import logging

        from jupyter_client.session import Session

        self.db, self.session, self.log = db, Session(key=b"k"), logging.getLogger("hub")


def journal(db):
    from ipyparallel_broadcast.controller.records import BroadcastRecords
    from ipyparallel_broadcast.wire import protocol as P

    hub = HubStandIn(db)
    records = BroadcastRecords(hub)
    assert set(records.copy_handlers()) == {P.INBCAST, P.OUTBCAST, P.OUTBUNDLE}
    order = []
    hub.monitor_handlers = {  # the copies' handlers, seen through our stand-in
        topic: lambda idents, frames, t=topic: records.journal.defer(
            lambda i, f: order.append((t, f[0])), idents, frames
        )
        for topic in (P.INBCAST, P.OUTBCAST, P.OUTBUNDLE)
    }
    return hub, records, order


@given(st.integers(1, 40), st.integers(1, 5))
def test_copies_are_filed_in_order_when_asked_and_the_oldest_past_the_bound_are_dropped(n, limit):
    from ipyparallel_broadcast.controller.records import JOURNAL_FACTOR
    from ipyparallel_broadcast.wire import protocol as P

    hub, records, order = journal(BroadcastDictDB(record_limit=limit))
    for i in range(n):
        hub.monitor_handlers[P.OUTBUNDLE]([P.OUTBUNDLE], [b"%d" % i])
    assert order == []  # nothing read until someone may read the records
    records.file_all()
    kept = min(n, JOURNAL_FACTOR * limit)
    assert [f for _, f in order] == [b"%d" % i for i in range(n - kept, n)]
    assert records.journal.dropped == n - kept


def test_another_store_gets_every_copy_filed_never_dropped():
    from ipyparallel.controller.dictdb import NoDB

    from ipyparallel_broadcast.wire import protocol as P

    hub, records, order = journal(NoDB())
    for i in range(2000):
        hub.monitor_handlers[P.OUTBUNDLE]([P.OUTBUNDLE], [b"%d" % i])
    assert len(order) + len(records.journal) == 2000 and records.journal.dropped == 0


def test_the_bound_counts_the_engine_outcomes_a_copy_carries():
    """A root's bundle copy is labelled with its engines' count: a few large
    calls fill the journal as many small ones do (the records they make)."""
    from ipyparallel_broadcast.controller.records import JOURNAL_FACTOR
    from ipyparallel_broadcast.wire import protocol as P

    limit = 8
    hub, records, order = journal(BroadcastDictDB(record_limit=limit))
    per_call = 2 * limit
    for i in range(JOURNAL_FACTOR):  # each carries two limits' worth of records
        hub.monitor_handlers[P.OUTBUNDLE]([P.OUTBUNDLE, b"%d" % per_call], [b"%d" % i])
    assert records.journal.outcomes <= JOURNAL_FACTOR * limit
    assert len(records.journal) == JOURNAL_FACTOR // 2 and records.journal.dropped == JOURNAL_FACTOR // 2
    huge = JOURNAL_FACTOR * limit * 10
    hub.monitor_handlers[P.OUTBUNDLE]([P.OUTBUNDLE, b"%d" % huge], [b"huge"])
    assert [m[0] for _, _, m, _ in records.journal] == [b"huge"]  # the newest copy always stays
    records.file_all()
    assert order[-1] == (P.OUTBUNDLE, b"huge")
