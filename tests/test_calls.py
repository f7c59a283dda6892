"""The client's pure core (``calls``): outcomes filed per call, no sockets."""

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ipyparallel_broadcast.client.calls import FAILED, Call, Calls, vid_parts
from ipyparallel_broadcast.wire import protocol as P

pytestmark = pytest.mark.pure

MSG_ID = "ipb-abc_1_2"
HEADER = {"msg_id": MSG_ID, "msg_type": "apply_request", "date": "2026-01-01T00:00:00Z"}
UUIDS = [f"uuid-{i}" for i in range(4)]
log = logging.getLogger("test_calls")


def reply(uuid, outputs="reply", msg_id=MSG_ID):
    md = {"engine": uuid}
    if outputs == "reply":
        md[P.OUTPUTS_KEY] = {"stdout": "", "stderr": "", "outputs": []}
    elif outputs == "iopub":
        md[P.OUTPUTS_KEY] = {"iopub": True}
    return {
        "header": {"msg_type": "apply_reply"},
        "parent_header": {"msg_id": msg_id},
        "metadata": md,
        "content": {"status": "ok"},
        "buffers": [],
    }


def new_call(calls=None):
    calls = calls or Calls()
    return calls, calls.start(Call(MSG_ID, HEADER, [10, 11, 12, 13], UUIDS))


def test_a_bundle_settles_each_engine_once_in_target_order():
    calls, call = new_call()
    got = calls.bundle(call, [("parsed", reply(UUIDS[2])), ("parsed", reply(UUIDS[0]))], "t1", None, log)
    assert got == [2, 0] and call.left == 2 and not call.done
    again = calls.bundle(call, [("parsed", reply(UUIDS[2])), ("parsed", reply("stranger"))], "t2", None, log)
    assert again == [] and call.left == 2  # a second outcome and an unknown engine are ignored
    calls.bundle(call, [("failed", [11, None, "Engine 11 died"]), ("failed", [13, UUIDS[3], "gone"])], "t3", None, log)
    assert call.done and call.outputs_done
    assert [o[0] for o in call.outcomes] == ["reply", FAILED, "reply", FAILED]
    assert call.outcomes[1] == (FAILED, 11, UUIDS[1], "Engine 11 died")  # uuid found from the engine id
    assert call.received == ["t1", "t3", "t1", "t3"]
    assert call.outcomes[0][1]["parent_header"] is HEADER  # the request's own header


def test_raw_replies_are_unpacked_and_checked_against_the_call():
    calls, call = new_call()
    got = calls.bundle(
        call,
        [("reply", UUIDS[0]), ("reply", UUIDS[1])],
        None,
        lambda u: reply(u, msg_id=MSG_ID if u == UUIDS[0] else "ipb-other"),
        log,
    )
    assert got == [0]  # the reply to another request is dropped, not filed


def test_an_outcome_that_cannot_be_read_is_skipped_and_the_rest_are_filed(caplog):
    calls, call = new_call()
    broken = {"header": {}, "parent_header": {}, "metadata": None, "content": {}}
    got = calls.bundle(call, [("parsed", broken), ("parsed", reply(UUIDS[1])), ("bogus", None)], None, None, log)
    assert got == [1]
    assert caplog.text.count("Dropped an engine outcome") == 2


def test_outputs_on_iopub_finish_with_the_idle_status_whichever_comes_first():
    calls, call = new_call()
    assert not calls.output_done(call, 1)  # idle before the reply
    calls.bundle(call, [("parsed", reply(u, outputs="iopub")) for u in UUIDS], None, None, log)
    assert call.done and call.iopub == 3 and not call.outputs_done
    for i in (0, 2, 3):
        assert calls.output_done(call, i)
    assert not calls.output_done(call, 0)  # once only
    assert call.outputs_done


def test_replies_without_our_outputs_wait_for_iopub():
    calls, call = new_call()
    calls.bundle(call, [("parsed", reply(u, outputs=None)) for u in UUIDS], None, None, log)
    assert call.done and call.iopub == 4


def test_fail_settles_only_what_is_owed():
    calls, call = new_call()
    calls.bundle(call, [("parsed", reply(UUIDS[0]))], None, None, log)
    got = calls.fail(call, UUIDS, lambda eid: f"engine {eid} lost")
    assert got == [1, 2, 3] and call.done
    assert call.outcomes[2] == (FAILED, 12, UUIDS[2], "engine 12 lost")


def test_finished_calls_stay_recallable_up_to_kept():
    calls = Calls(kept=2)
    made = []
    for k in range(3):
        call = calls.start(Call(f"ipb-m{k}_1", HEADER, [1], ["u"]))
        calls.fail(call, ["u"], str)
        calls.finish(call)
        made.append(call)
    assert len(calls) == 0 and list(calls.recent) == ["ipb-m1_1", "ipb-m2_1"]
    assert calls.of_vid("ipb-m2_1_u") == (made[2], 0)
    assert calls.of_vid("ipb-m0_1_u") == (None, None)  # forgotten
    assert calls.of_vid("not-a-broadcast_u") == (None, None)


def test_per_engine_ids_split_back():
    _, call = new_call()
    assert call.vids[1] == f"{MSG_ID}_{UUIDS[1]}"
    assert vid_parts(call.vids[1]) == (MSG_ID, UUIDS[1])


@given(st.lists(st.tuples(st.sampled_from(["parsed", "failed", "fail", "idle"]), st.integers(0, 5)), max_size=40))
def test_any_mix_settles_every_engine_at_most_once(events):
    calls, call = new_call()
    for kind, i in events:
        uuid = UUIDS[i] if i < len(UUIDS) else f"stranger-{i}"
        if kind == "parsed":
            calls.bundle(call, [("parsed", reply(uuid, outputs="iopub"))], None, None, log)
        elif kind == "failed":
            calls.bundle(call, [("failed", [i, uuid, "x"])], None, None, log)
        elif kind == "fail":
            calls.fail(call, [uuid], str)
        elif i < len(UUIDS):
            calls.output_done(call, i)
    settled = [o for o in call.outcomes if o is not None]
    assert call.left == len(UUIDS) - len(settled) >= 0
    streaming = sum(1 for o in settled if o[0] == "reply" and o[2])
    assert call.iopub == streaming


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text() | st.binary(),
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.tuples(inner, inner)
            | st.dictionaries(st.text(max_size=3), inner, max_size=4)
        ),
        max_leaves=12,
    )
)
def test_results_unpack_as_ipyparallel_unpacks_them(value):
    from ipyparallel.serialize import deserialize_object, serialize_object

    from ipyparallel_broadcast.client.results import unpack_result

    buffers = serialize_object(value)
    assert unpack_result(buffers) == deserialize_object(buffers)[0] == value


def test_results_with_extracted_buffers_unpack_as_ipyparallel_unpacks_them():
    import numpy as np
    from ipyparallel.serialize import serialize_object

    from ipyparallel_broadcast.client.results import unpack_result

    value = {"a": np.arange(300_000.0), "b": [np.ones(3), "x"]}
    buffers = serialize_object(value, buffer_threshold=1024)
    assert len(buffers) > 1
    got = unpack_result([memoryview(b) for b in buffers])
    np.testing.assert_array_equal(got["a"], value["a"])
    np.testing.assert_array_equal(got["b"][0], value["b"][0])
    assert got["b"][1] == "x"


def test_recent_calls_are_bounded_by_their_outcomes_too():
    calls = Calls(kept=16, kept_outcomes=5)
    for k, n in enumerate([2, 2, 2, 9]):
        call = calls.start(Call(f"ipb-m{k}_1", HEADER, list(range(n)), [f"u{i}" for i in range(n)]))
        calls.fail(call, call.uuids, str)
        calls.finish(call)
        if k == 2:
            assert list(calls.recent) == ["ipb-m1_1", "ipb-m2_1"]  # 6 outcomes: the oldest went
    assert list(calls.recent) == ["ipb-m3_1"]  # the last call is kept, however big


# ------------------------------------------- a host's table, filed and unpacked
def table_bundle(values, statuses):
    """A ``replies`` bundle of engines ``uuid-k`` answering ``values[k]``, as a leaf packs it."""
    from ipyparallel.serialize import serialize_object
    from jupyter_client.session import Session

    from ipyparallel_broadcast.wire import bundles as B

    session = Session(key=b"k")
    codec = P.Codec(session)
    bodies = []
    for k, (value, status) in enumerate(zip(values, statuses)):
        content = {"status": status}
        if status == "error":
            content.update(ename="ValueError", evalue="bad", traceback=[], engine_info={})
        msg = session.msg(
            "apply_reply",
            content=content,
            metadata={"engine": UUIDS[k], P.OUTPUTS_KEY: {"stdout": "", "stderr": "", "outputs": []}},
        )
        bodies.append(session.serialize(msg)[1:] + list(serialize_object(value, buffer_threshold=64)))
    return list(B.iter_bundle(codec, codec.unpack(B.pack_replies(codec, "r", MSG_ID, bodies, [])), tables=True))


class ErrorsAsTuples:
    """What ``outcome_result`` asks of the client, for errors."""

    _remote_error = staticmethod(lambda content: ("error", content["ename"]))


def test_a_table_files_every_engine_in_one_pass_and_results_unpack_in_one(monkeypatch):
    import numpy as np

    from ipyparallel_broadcast.client import results as R

    unpacked = []
    unpack = R.unpack_result
    monkeypatch.setattr(R, "unpack_result", lambda buffers: unpacked.append(1) or unpack(buffers))
    calls, call = new_call()
    values = [1.5, np.arange(100.0), "x", None]  # the array's buffer is extracted (two buffers)
    outcomes = table_bundle(values, ["ok", "ok", "ok", "error"])
    assert [what for what, _ in outcomes] == ["table"]
    assert calls.bundle(call, outcomes, "t", None, log) == [0, 1, 2, 3] and call.done
    assert call.iopub == 0  # outputs came in the replies
    client = ErrorsAsTuples()
    results = R.call_results(client, call)
    assert len(unpacked) == 3  # the error is read from its reply, one by one
    assert results[0] == 1.5 and results[2] == "x" and results[3] == ("error", "ValueError")
    np.testing.assert_array_equal(results[1], values[1])
    assert all(a is b for a, b in zip(R.call_results(client, call), results))  # unpacked once
    assert len(unpacked) == 3


def test_failed_engines_and_table_replies_unpack_together():
    """A failure is a 4-tuple too, ``(FAILED, eid, uuid, message)``: only
    replies in a table are read from it (the rest of the table unpacks)."""
    from ipyparallel_broadcast.client.calls import in_table, reply_of
    from ipyparallel_broadcast.client.results import call_results

    calls, call = new_call()
    calls.fail(call, [UUIDS[1]], lambda eid: f"Engine {eid} died")
    outcomes = table_bundle([1, 2, 3, 4], ["ok"] * 4)
    assert calls.bundle(call, outcomes, "t", None, log) == [0, 2, 3] and call.done
    assert [in_table(o) for o in call.outcomes] == [True, False, True, True]
    assert reply_of(call.outcomes[2])["content"] == {"status": "ok"}
    results = call_results(ErrorsAsTuples(), call)
    assert results[0] == 1 and results[2:] == [3, 4]
    assert results[1] == ("error", "EngineError")


def test_an_engines_metadata_is_made_once_whichever_threads_read_it_first():
    """The I/O thread (an output arriving) and the user's (``ar.stdout``,
    ``wait_for_output``) may read a call's metadata first at the same time:
    both must get the one object the output goes into (made twice, an
    engine's stdout was lost)."""
    import sys
    import threading

    from ipyparallel_broadcast.client.results import outcome_metadata

    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    try:
        for trial in range(200):
            call = Call(f"ipb-t{trial}_1", HEADER, list(range(8)), [f"u{i}" for i in range(8)])
            start = threading.Barrier(4)
            seen = [None] * 4

            def read(k, call=call, start=start, seen=seen):
                start.wait()
                seen[k] = [id(outcome_metadata(None, call, i)) for i in range(8)]

            threads = [threading.Thread(target=read, args=(k,)) for k in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert all(s == seen[0] for s in seen), f"trial {trial}: metadata made more than once"
            assert seen[0] == [id(md) for md in call.mds]
    finally:
        sys.setswitchinterval(before)


def test_an_output_finds_its_engine_by_uuid_or_by_the_engine_id_in_its_topic():
    """A simulated engine's output names no engine in its metadata; the client
    then reads the id in its IOPub topic, from the call's own targets, not
    from the client's engine table (which forgets an engine that died after
    it answered: its stdout was then dropped while its idle status, which
    names the engine, ended the output: an empty stdout, no trace)."""
    call = Call(MSG_ID, HEADER, [10, 11, 12, 13], UUIDS)
    assert call.engine_index(UUIDS[2], None) == 2
    assert call.engine_index(None, 13) == 3
    assert call.engine_index(None, 99) is None and call.engine_index("nobody", None) is None
    assert call.engine_index("nobody", 11) == 1
