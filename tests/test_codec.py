"""The Codec speaks jupyter_client's wire format exactly: what it packs a
Session reads, what a Session packs it reads, and it refuses what a Session
refuses (forged, unsigned and replayed messages)."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jupyter_client.session import Session

from ipyparallel_broadcast.wire import bundles as B
from ipyparallel_broadcast.wire import protocol as P

pytestmark = pytest.mark.pure


@pytest.fixture(params=["hmac-sha256", "hmac-sha512"])
def session(request):
    return Session(key=b"a key", signature_scheme=request.param)


def test_a_session_reads_what_the_codec_packs(session):
    codec = P.Codec(session)
    parent = session.msg_header("apply_request")
    frames = codec.pack("ipb_thing", {"a": [1, 2]}, [b"buf"], parent=parent)
    assert frames[0] == P._DELIM
    msg = Session(key=b"a key", signature_scheme=session.signature_scheme).deserialize(frames[1:])
    assert msg["content"] == {"a": [1, 2]} and msg["msg_type"] == "ipb_thing"
    assert msg["parent_header"]["msg_id"] == parent["msg_id"]
    assert set(msg["header"]) == set(session.msg_header("x"))
    assert [bytes(b) for b in msg["buffers"]] == [b"buf"]


def test_the_codec_reads_what_a_session_packs(session):
    codec = P.Codec(Session(key=b"a key", signature_scheme=session.signature_scheme))
    msg = session.msg("apply_reply", content={"status": "ok"}, metadata={"engine": "u"})
    frames = session.serialize(msg)[1:] + [b"buf"]
    codec.check_signature(frames)
    got = codec.unpack(frames)
    assert got["content"] == {"status": "ok"} and got["metadata"] == {"engine": "u"}
    assert got["header"]["msg_id"] == msg["header"]["msg_id"] and got["buffers"] == [b"buf"]
    assert codec.content(codec.unpack(session.serialize(session.msg("x", content={"b": 1}))[1:], content=False)) == {
        "b": 1
    }


def test_forged_unsigned_and_replayed_messages_are_refused(session):
    codec = P.Codec(session)
    frames = codec.pack("x", {"a": 1})[1:]
    forged = [frames[0][:-1] + b"0" if frames[0][-1:] != b"0" else frames[0][:-1] + b"1"] + frames[1:]
    for bad in (forged, [b""] + frames[1:], frames[:4]):
        with pytest.raises(P.ProtocolError):
            codec.unpack(bad)
    with pytest.raises(P.ProtocolError):
        codec.check_signature(forged)
    codec.unpack(frames)
    with pytest.raises(P.ProtocolError, match="replay"):
        codec.unpack(frames)


def test_a_peek_does_not_spend_the_signature(session):
    codec = P.Codec(session)
    frames = codec.pack("x", {"a": 1})[1:]
    codec.unpack(frames, content=False)
    assert codec.unpack(frames)["content"] == {"a": 1}


def test_the_replay_history_is_bounded_by_the_sessions_setting():
    codec = P.Codec(Session(key=b"secret", digest_history_size=10))  # Session.digest_history_size
    first = codec.pack("x", {"n": -1})[1:]
    codec.unpack(first)
    for n in range(10):
        codec.unpack(codec.pack("x", {"n": n})[1:])
    assert len(codec._seen) == 10
    assert codec.unpack(first)["content"] == {"n": -1}  # forgotten, as Session's culling forgets


def test_without_a_key_messages_are_unsigned():
    codec = P.Codec(Session(key=b""))
    frames = codec.pack("x", {"a": 1})[1:]
    assert frames[0] == b""
    assert codec.unpack(frames)["content"] == {"a": 1}
    assert Session(key=b"").deserialize(frames)["content"] == {"a": 1}


# -------------------------------------------------- replies with joined buffers
def engine_replies(session, buffer_sets, statuses=None, outputs=None):
    bodies = []
    for i, buffers in enumerate(buffer_sets):
        metadata = {"engine": f"u{i}"}
        if outputs is not None and outputs[i] is not None:
            metadata[P.OUTPUTS_KEY] = outputs[i]
        content = {"status": statuses[i] if statuses else "ok", "n": i}
        msg = session.msg("apply_reply", content=content, metadata=metadata)
        bodies.append(session.serialize(msg)[1:] + list(buffers))
    return bodies


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.sampled_from([0, 1, 10, 100, P.PACK_BELOW - 1, P.PACK_BELOW, P.PACK_BELOW + 7]), max_size=3),
        max_size=6,
    )
)
def test_replies_buffers_come_back_whole_joined_or_not(sizes):
    session = Session(key=b"a key")
    codec = P.Codec(session)
    buffer_sets = [[bytes([i % 251]) * n for i, n in enumerate(s)] for s in sizes]
    frames = B.pack_replies(codec, "r0", "ipb-m", engine_replies(session, buffer_sets), [])
    msg = codec.unpack(frames)
    small = sum(1 for s in sizes for n in s if n < P.PACK_BELOW)
    big = sum(1 for s in sizes for n in s if n >= P.PACK_BELOW)
    texts = 1  # the replies' header, metadata and content, as one frame
    assert len(msg["buffers"]) == texts + (1 + big if small > 1 else small + big)  # the small ones joined
    got = [[bytes(b) for b in item["buffers"]] for _, item in B.iter_bundle(codec, msg)]
    assert got == buffer_sets


@pytest.mark.parametrize("packed", [[3, 4], [3, -1], [2, "x"], "3", [4], [True, 5], [2.0, 4], [-2, 6], []])
def test_a_buffer_table_that_does_not_match_is_refused(packed):
    with pytest.raises(P.ProtocolError):
        P.split_joined(packed, [b"abcdef"])


def test_a_buffer_table_with_a_frame_too_many_is_refused():
    assert [bytes(b) for b in P.split_joined([2, 4], [b"abcdef"])] == [b"ab", b"cdef"]
    with pytest.raises(P.ProtocolError):
        P.split_joined([2, 4], [b"abcdef", b"one alone too many"])


@pytest.mark.parametrize("counts", [[1, 1, 1], [1, True], [1, 1.0], [2, 1, 0, -1], [1], "1", [1, 1, 1, 1]])
def test_part_counts_that_do_not_match_their_buffers_are_refused(counts):
    with pytest.raises(P.ProtocolError):
        B._parts(counts, [b"a", b"b"], 2 if isinstance(counts, list) and len(counts) == 2 else None)


# ----------------------------------------------------------- replies as a table
def table_of(codec, frames):
    ((what, table),) = [o for o in B.iter_bundle(codec, codec.unpack(frames), tables=True)]
    assert what == "table"
    return table


def test_a_replies_table_reads_status_and_iopub_without_parsing_replies():
    session = Session(key=b"a key")
    codec = P.Codec(session)
    bodies = engine_replies(
        session,
        [[b"r0"], [b"r1"], [b"r2"]],
        statuses=["ok", "error", "ok"],
        outputs=[None, {"iopub": False}, {"iopub": True}],
    )
    table = table_of(codec, B.pack_replies(codec, "r0", "ipb-m", bodies, []))
    assert table.engines == ["u0", "u1", "u2"]
    assert [table.status(k) for k in range(3)] == ["ok", "error", "ok"]
    assert table.iopub == {0, 2}  # a stock engine (no outputs key), and one whose outputs went to IOPub
    assert not table.parsed
    entry = B.Entry(table, 1)
    assert entry.status == "error" and [bytes(b) for b in entry.buffers] == [b"r1"]
    assert entry["content"] == {"status": "error", "n": 1} and entry["metadata"]["engine"] == "u1"
    assert list(table.parsed) == [1]  # only what was read


@pytest.mark.parametrize("per", [1, 3])
def test_a_usual_table_holds_no_object_per_engine(per):
    """As many small buffers per engine (the usual): the table keeps the
    joined frame and reads each engine's buffers as slices when asked."""
    session = Session(key=b"a key")
    codec = P.Codec(session)
    buffers = [[bytes([i, j]) * (i + j) for j in range(per)] for i in range(5)]
    table = table_of(codec, B.pack_replies(codec, "r0", "ipb-m", engine_replies(session, buffers), []))
    assert isinstance(table.parts, B.SlicesEach) and len(table.parts) == 5
    assert [[bytes(b) for b in table.parts[k]] for k in range(5)] == buffers
    for k in (-1, 5):
        with pytest.raises(IndexError):
            table.parts[k]


def test_a_replies_table_with_tampered_texts_is_refused():
    session = Session(key=b"a key")
    codec = P.Codec(session)
    frames = B.pack_replies(codec, "r0", "ipb-m", engine_replies(session, [[b"a"], [b"b"]]), [])
    texts = frames[5]
    tampered = re.sub(rb'("n": ?)0', rb"\g<1>9", texts)  # (json or orjson text; same size)
    assert tampered != texts
    forged = frames[:5] + [tampered] + frames[6:]
    msg = codec.unpack(forged)  # the signed content is intact ...
    with pytest.raises(P.ProtocolError, match="digest"):
        list(B.iter_bundle(codec, msg))  # ... but the texts no longer match its digest


def test_an_unreadable_reply_is_left_out_of_the_table():
    session = Session(key=b"a key")
    codec = P.Codec(session)
    bodies = engine_replies(session, [[b"a"], [b"b"], [b"c"]])
    bodies[1] = bodies[1][:4] + [b"not json"] + bodies[1][5:]
    table = table_of(codec, B.pack_replies(codec, "r0", "ipb-m", bodies, []))
    assert table.engines == ["u0", "u2"]
    assert [bytes(b) for k in range(2) for b in table.parts[k]] == [b"a", b"c"]


@pytest.mark.parametrize(
    "change",
    [
        {"texts": ["x", 1]},
        {"texts": [-1, 100]},
        {"parts": ["1", 1]},
        {"engines": "u0"},
        {"odd": [1]},
        {"packed": [1, 5]},
        {"packed": [1, True]},
        {"packed": [1.0, 1]},
        {"packed": [-1, 2]},
        {"packed": [2]},
        {"parts": [1, True]},
    ],
)
def test_a_signed_but_malformed_table_is_a_protocol_error(change):
    """A table with bad fields, even signed, is refused as a ProtocolError
    (dropped and logged), never another exception."""
    import json

    session = Session(key=b"a key")
    codec = P.Codec(session)
    frames = B.pack_replies(codec, "r0", "ipb-m", engine_replies(session, [[b"a"], [b"b"]]), [])
    content = dict(json.loads(frames[4]), **change)
    forged = codec.serialize(P.BUNDLE, content, metadata=B.bundle_metadata("r0", "ipb-m", "replies"))[1:] + frames[5:]
    with pytest.raises(P.ProtocolError):
        list(B.iter_bundle(codec, codec.unpack(forged), tables=True))


def test_a_record_copy_leaves_out_big_buffers_and_stays_signed(session):
    big, small = memoryview(bytearray(P.RECORD_LIMIT)).cast("d"), b"s" * 10
    msg = session.msg("execute_request", content={})
    frames = session.serialize(msg) + [small, big]
    copy = P.strip_big(frames, 2)
    assert copy[:-1] == frames[:-1] and copy[-1] == P.STRIPPED + str(P.RECORD_LIMIT).encode()
    assert P.is_stripped(copy[-1]) and not P.is_stripped(small)
    assert session.deserialize(copy[1:])["buffers"][0] == small  # the signature still holds
    assert P.strip_big(frames, 1, limit=5)[:-1] == frames[:-1]  # only the last n_buffers are looked at


@pytest.mark.parametrize("targets", [[True], [0, -1], [1.0], ["0"], [0, None], "0,1", None])
def test_a_request_naming_no_engine_ids_is_refused(targets):
    with pytest.raises(P.ProtocolError, match="targets must be a list of engine ids"):
        P.validate_request(P.request_content("b.1", [0], P.COALESCE) | dict(targets=targets))


def test_a_request_for_engine_ids_is_valid():
    for targets in ([0], [3, 1, 2], list(range(1024))):
        assert P.validate_request(P.request_content("b.1", targets, P.COALESCE))["targets"] == targets


@pytest.mark.parametrize("packer, spliced", [("json", True), ("orjson", True), ("pickle", False)])
def test_replies_travel_as_tables_with_either_json_packer(packer, spliced):
    """orjson is jupyter_client's default packer when installed; its messages
    are JSON text too, so engine replies still travel as a host's table."""
    session = Session(key=b"a key", packer=packer, unpacker=packer)
    codec = P.Codec(session)
    assert B.splices_json(codec) is spliced
    if spliced:
        frames = B.pack_replies(codec, "r0", "ipb-m", engine_replies(session, [[b"a"], [b"b"]]), [])
        assert table_of(codec, frames).engines == ["u0", "u1"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.sampled_from([0, 3, 100, P.PACK_BELOW - 1, P.PACK_BELOW, P.PACK_BELOW + 7]), max_size=3)))
def test_a_bundles_parts_come_back_whole_with_their_small_frames_joined(sizes):
    """``pack_bundle`` joins the small frames of its parts in one frame; the
    reader gets each part's frames back, byte for byte."""
    session = Session(key=b"a key")
    codec = P.Codec(session)
    replies = engine_replies(session, [[bytes([i % 251]) * n for i, n in enumerate(s)] for s in sizes])
    frames = B.pack_bundle(codec, "r0", "ipb-m", "engines", replies, [])
    msg = codec.unpack(frames)
    every = [f for r in replies for f in r]
    small = sum(1 for f in every if P.nbytes(f) < P.PACK_BELOW)
    assert len(msg["buffers"]) == (len(every) - small + 1 if small > 1 else len(every))
    got = [[bytes(f) for f in item] for _, item in B.iter_bundle(codec, msg)]
    assert got == [[bytes(f) for f in r] for r in replies]
