"""Broadcasts in the hub's task records, one per engine, as DirectView's:
``rc.db_query``, ``rc.result_status``, ``rc.queue_status`` and ``get_result``
from another client (which can only ask the hub)."""

import os
import tempfile

import pytest
from cluster_util import at_gate, quiet_config, running_cluster, until

import ipyparallel_broadcast as ipb

pytestmark = pytest.mark.cluster

N = 4
FIELDS = [
    "msg_id",
    "engine_uuid",
    "client_uuid",
    "header",
    "content",
    "buffers",
    "submitted",
    "started",
    "completed",
    "received",
    "result_header",
    "result_content",
    "stdout",
]


@pytest.fixture(scope="module")
def rc():
    with running_cluster(N, 1, 2) as client:
        yield client


def shout(x):
    print("value", x)
    return 2 * x


def records(rc, msg_ids, n=None):
    """The hub's records for msg_ids, once every one of them has completed."""
    query = {"msg_id": {"$in": list(msg_ids)}}

    def done():
        found = rc.db_query(query, keys=["completed"])
        return len(found) == (n or len(msg_ids)) and all(r["completed"] for r in found)

    until(done, what="the hub to record every result")
    return {r["msg_id"]: r for r in rc.db_query(query, keys=FIELDS)}


def other_client(rc):
    (path,) = [
        os.path.join(rc.test_profile_dir, "security", f)
        for f in os.listdir(os.path.join(rc.test_profile_dir, "security"))
        if f.endswith("client.json")
    ]
    return ipb.Client(path)


@pytest.mark.parametrize("coalescing", [True, False, 2])
def test_each_engine_has_a_record_like_directview(rc, coalescing):
    ar = rc.broadcast_view(coalescing=coalescing).apply_async(shout, 21)
    assert ar.get(timeout=60) == [42] * N
    ours = records(rc, ar.msg_ids)
    assert sorted(ours) == sorted(ar.msg_ids)
    assert {r["engine_uuid"] for r in ours.values()} == {rc._engines[e] for e in rc.ids}
    direct = rc.direct_view(rc.ids).apply_async(shout, 21)
    direct.get(timeout=60)
    theirs = records(rc, direct.msg_ids)
    for mine, stock in zip(ours.values(), theirs.values()):
        filled = {k for k, v in stock.items() if v not in (None, "", [])}
        assert filled <= {k for k, v in mine.items() if v not in (None, "", [])}
        assert mine["result_content"]["status"] == "ok"
        assert mine["stdout"] == "value 21\n"  # the engine's output, filed under its own id


def test_another_client_gets_status_and_results_from_the_hub(rc):
    ar = rc.broadcast_view().apply_async(shout, 5)
    ar.get(timeout=60)
    records(rc, ar.msg_ids)
    rc2 = other_client(rc)
    try:
        status = rc2.result_status(ar.msg_ids)
        assert sorted(status["completed"]) == sorted(ar.msg_ids) and not status["pending"]
        assert rc2.get_result(ar.msg_ids).get(timeout=60) == [10] * N
    finally:
        rc2.close()


def test_queue_status_counts_broadcasts_pending_then_completed(rc):
    before = rc.queue_status()
    gate = os.path.join(tempfile.mkdtemp(prefix="ipb-gate-"), "open")
    ar = rc.broadcast_view().apply_async(at_gate, gate)
    until(lambda: all(rc.queue_status()[e]["queue"] == 1 for e in rc.ids), what="queued records")
    open(gate, "w").close()
    ar.get(timeout=60)
    records(rc, ar.msg_ids)
    after = rc.queue_status()
    for eid in rc.ids:
        assert after[eid]["queue"] == 0
        assert after[eid]["completed"] == before[eid]["completed"] + 1


def test_collectives_leave_records_per_engine(rc):
    view = rc.broadcast_view()
    view.scatter("part", list(range(2 * N)), block=True)
    assert view.gather("part", block=True) == list(range(2 * N))
    ar = view.map_async(lambda x: x + 1, range(N))
    assert ar.get(timeout=60) == list(range(1, N + 1))
    records(rc, ar.msg_ids)
    reduced = view.reduce(lambda: 1, op="sum", block=False)
    assert reduced.get(timeout=60) == N
    msg_id = reduced.msg_ids[0]
    found = records(rc, [f"{msg_id}_{rc._engines[e]}" for e in rc.ids])
    assert len(found) == N  # combined in the tree, each engine's part still filed


def test_records_keep_metadata_not_big_buffers_and_resubmit_says_so(rc):
    from ipyparallel import RemoteError

    from ipyparallel_broadcast.wire import protocol

    view = rc.broadcast_view()
    big, small = b"x" * protocol.RECORD_LIMIT, b"y" * 100
    ar = view.apply_async(len, big)
    assert ar.get(timeout=60) == [len(big)] * N
    filed = records(rc, ar.msg_ids)
    assert all(protocol.STRIPPED + str(len(big)).encode() in r["buffers"] for r in filed.values())
    with pytest.raises(RemoteError, match="not kept by the hub"):
        rc.resubmit(ar.msg_ids[:1]).get(timeout=60)
    small_call = view.apply_async(len, small)
    small_call.get(timeout=60)
    again = rc.resubmit(small_call.msg_ids[:1])  # whole records resubmit as before
    assert again.get(timeout=60) == [len(small)]  # one record, rerun as a task


def test_a_result_shared_with_its_caller_is_filed_as_not_kept(rc):
    """Big reply buffers went to the caller by shared memory: the hub says so."""
    from ipyparallel import RemoteError

    ar = rc.broadcast_view().apply_async(bytes, 1 << 20)
    assert ar.get(timeout=60) == [bytes(1 << 20)] * N
    filed = records(rc, ar.msg_ids)
    assert all(r["result_content"]["ename"] == "ResultNotKept" for r in filed.values())
    rc2 = other_client(rc)
    try:
        with pytest.raises(RemoteError, match="shared memory"):
            rc2.get_result(ar.msg_ids[:1]).get(timeout=60)
    finally:
        rc2.close()


def test_hub_records_can_be_turned_off():
    config = quiet_config()
    config.BroadcastController.hub_records = False
    with running_cluster(2, 1, 2, config=config) as rc:
        ar = rc.broadcast_view().apply_async(shout, 1)
        assert ar.get(timeout=60) == [2, 2]
        assert rc.db_query({"msg_id": {"$in": ar.msg_ids}}, keys=["msg_id"]) == []
