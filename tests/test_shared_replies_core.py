"""Big reply buffers by shared memory, sans cluster: an engine of the client's
host writes them once into a segment named for the client, the leaf's table
names it, and the client maps it and unlinks the name; anything else (another
host, a foreign or vanished segment) takes the usual path or fails that engine
by name."""

import os
import subprocess
import sys

import pytest

from ipyparallel_broadcast.client.calls import FAILED, Call, Calls
from ipyparallel_broadcast.client.shared import SharedReplies
from ipyparallel_broadcast.host import shm
from ipyparallel_broadcast.wire import bundles as B
from ipyparallel_broadcast.wire import protocol as P
from ipyparallel_broadcast.wire.protocol import Codec

pytestmark = pytest.mark.pure
BIG = bytes(range(256)) * 1024  # 256 KiB


@pytest.fixture
def client(tmp_path, monkeypatch):
    monkeypatch.setenv("IPB_SHM_DIR", str(tmp_path))
    return SharedReplies(threshold=1 << 16)


@pytest.fixture
def codec():
    from jupyter_client.session import Session

    return Codec(Session(key=b"secret"))


def engine_reply(codec, uuid, buffers, md_extra=None):
    """A signed engine reply's frames ``[sig, header, parent, md, content, *buffers]``."""
    md = dict(engine=uuid, ipb_outputs=dict(stdout="", stderr="", outputs=[]), **(md_extra or {}))
    return codec.serialize("apply_reply", dict(status="ok"), {"msg_id": "m"}, md)[1:] + list(buffers)


def shared_reply(client, codec, uuid, buffers):
    """What our engine sends a client of its host: big buffers shared, their frames empty."""
    md = {}
    out = shm.share_reply(list(buffers), client.spec, md, client.here)
    return engine_reply(codec, uuid, out, md), md.get(P.SHM_KEY)


def table_of(codec, bodies):
    frames = B.pack_replies(codec, "r1", "m", bodies, [])
    msg = codec.unpack(frames)
    return next(item for what, item in B.iter_bundle(codec, msg, tables=True) if what == "table")


def test_an_engine_of_the_clients_host_writes_big_buffers_once_and_the_client_maps_them(client, codec, tmp_path):
    body, ref = shared_reply(client, codec, "u0", [b"small", BIG])
    assert ref is not None and [i for i, _, _ in ref["bufs"]] == [1]  # only the big one
    assert ref["name"].startswith(client.prefix)
    assert [bytes(f) for f in body[5:]] == [b"small", b""]  # it travels as an empty frame
    table = table_of(codec, [body])
    assert [(k, r["name"]) for k, r in table.shm] == [(0, ref["name"])]
    assert client.fill(table) == {}
    assert bytes(table.parts[0][0]) == b"small" and bytes(table.parts[0][1]) == BIG
    assert os.listdir(tmp_path) == []  # the one reader unlinked the name at once
    table.parts[0][1][0] = 7  # copy-on-write: the client's own
    assert bytes(table.parts[0][1][:1]) == b"\x07"


def test_engines_with_one_shared_buffer_each_are_filled_in_place(client, codec):
    """A table of one buffer per engine (its frames empty: joined, the usual
    shape, read as slices) still holds lists the client fills in place."""
    bodies = [shared_reply(client, codec, f"u{k}", [BIG[k:]])[0] for k in range(2)]
    table = table_of(codec, bodies)
    assert client.fill(table) == {}
    assert [bytes(table.parts[k][0]) for k in range(2)] == [BIG, BIG[1:]]


def test_an_engine_of_another_host_or_a_bad_spec_sends_the_bytes(client, codec, tmp_path):
    here = shm.reply_identity()
    spec = client.spec
    md = {}
    for bad in (["elsewhere", spec[1], spec[2]], [here, "../../etc/x", spec[2]], [here, spec[1], 0], [here], None, 7):
        assert shm.share_reply([BIG], bad, md, here) == [BIG]
    assert shm.share_reply([b"x" * 100], spec, md, here) == [b"x" * 100]  # under the threshold
    assert shm.share_reply([BIG], spec, md, "") == [BIG]  # the engine cannot tell its host
    assert md == {}
    assert os.listdir(tmp_path) == []


def test_a_client_that_asks_nothing_is_asked_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("IPB_SHM_DIR", str(tmp_path))
    assert SharedReplies(threshold=0).spec is None
    assert SharedReplies(threshold=1, here="").spec is None  # shared memory with the engines cannot be proven
    assert SharedReplies(threshold=1).spec is not None


def test_a_foreign_or_vanished_segment_fails_only_that_engine_and_is_left_alone(client, codec, tmp_path):
    good, _ = shared_reply(client, codec, "u0", [BIG])
    gone, gone_ref = shared_reply(client, codec, "u1", [BIG])
    os.unlink(tmp_path / gone_ref["name"])
    other = SharedReplies(threshold=1 << 16)  # another client of this host, same user
    foreign, foreign_ref = shared_reply(other, codec, "u2", [BIG])
    table = table_of(codec, [good, gone, foreign])
    lost = client.fill(table)
    assert sorted(lost) == [1, 2]
    assert "is gone" in lost[1] and "not this client's" in lost[2]
    assert os.listdir(tmp_path) == [foreign_ref["name"]]  # never unlinked by the wrong client
    good, _ = shared_reply(client, codec, "u0", [BIG])  # (the first was read: its name is gone)
    call = Call("m", {"msg_id": "m"}, [0, 1, 2], ["u0", "u1", "u2"])
    calls = Calls()
    calls.start(call)
    settled = calls.bundle(call, [("table", table_of(codec, [good, gone]))], None, codec.unpack, None, client.fill)
    assert sorted(settled) == [0, 1]
    assert call.outcomes[0][0] == "reply"
    assert call.outcomes[1][0] == FAILED and "Engine 1:" in call.outcomes[1][3]
    other.close()
    assert os.listdir(tmp_path) == []


def test_a_table_naming_a_buffer_its_engine_did_not_send_is_refused(client, codec, tmp_path):
    body, ref = shared_reply(client, codec, "u0", [BIG])
    ref = dict(ref, bufs=[[3, *ref["bufs"][0][1:]]])  # an index past the reply's buffers
    forged = engine_reply(codec, "u0", [b""], {P.SHM_KEY: ref})
    table = table_of(codec, [forged])
    assert "lacks" in client.fill(table)[0]


def test_malformed_shared_tables_are_protocol_errors(codec):
    body = engine_reply(codec, "u0", [b""])
    frames = B.pack_replies(codec, "r1", "m", [body], [])
    msg = codec.unpack(frames)
    content = codec.unpack_json(msg["content"]) if isinstance(msg["content"], bytes) else msg["content"]
    for bad in ([[5, {}]], [["0", {}]], {"k": 1}, [[0]]):
        content["shm"] = bad
        with pytest.raises(P.ProtocolError, match="shared-memory"):
            B.ReplyTable(codec, content, msg["buffers"])


def test_unread_segments_go_when_the_client_closes_or_when_its_process_is_gone(client, codec, tmp_path):
    _, ref = shared_reply(client, codec, "u0", [BIG])
    unrelated = tmp_path / "unrelated"
    unrelated.write_bytes(b"")
    assert client.close() == [ref["name"]]
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    orphan = SharedReplies(threshold=1)
    orphan.prefix = f"ipb-shm-{os.getuid()}-{dead.stdout.strip()}-0badc0de-"
    orphan.ask(1, orphan.here)
    _, ref = shared_reply(orphan, codec, "u0", [BIG])
    assert shm.sweep() == [ref["name"]]  # as relays do when they start, and the controller when they stop
    assert os.listdir(tmp_path) == ["unrelated"]


def test_a_table_no_call_will_read_drops_only_this_clients_segments(client, codec, tmp_path):
    mine, _ = shared_reply(client, codec, "u0", [BIG])
    other = SharedReplies(threshold=1 << 16)
    foreign, foreign_ref = shared_reply(other, codec, "u1", [BIG])
    client.drop(table_of(codec, [mine, foreign]))
    assert os.listdir(tmp_path) == [foreign_ref["name"]]
    other.close()


def test_warm_buffers_are_reused_only_once_nothing_holds_them():
    import numpy as np

    from ipyparallel_broadcast.client.shared import WarmBuffers

    warm = WarmBuffers(limit=1 << 20)
    a = warm.take(5000)  # two pages
    assert a.nbytes == 5000 and not a.readonly and warm.kept == 8192
    b = warm.take(5000)  # a is held: a new one
    a_array = np.frombuffer(a, np.uint8)  # a result over it
    del a
    c = warm.take(5000)
    assert warm.reused == 0 and len(warm.by_size[8192]) == 3  # a's array still holds it; b is held
    del a_array, c
    d = warm.take(4097)
    assert warm.reused == 1 and d.nbytes == 4097 and warm.kept == 3 * 8192
    del b, d
    big = warm.take(1 << 20)  # fits only once the unheld small ones go
    assert warm.kept == 1 << 20 and list(warm.by_size) == [1 << 20]
    huge = warm.take(2 << 20)  # past the limit: fresh, not kept
    assert warm.kept == 1 << 20 and huge.nbytes == 2 << 20
    del big
    warm.clear()
    assert warm.kept == 0 and warm.by_size == {}
    assert WarmBuffers(limit=0).take(100).nbytes == 100  # nothing kept, still a buffer


def test_reading_a_reply_reuses_warm_buffers_and_never_one_a_result_holds(client, codec, tmp_path):
    from ipyparallel_broadcast.client.shared import WarmBuffers

    client.buffers = WarmBuffers(limit=1 << 22)
    first = table_of(codec, [shared_reply(client, codec, "u0", [BIG])[0]])
    assert client.fill(first) == {}
    held = first.parts[0][0]
    second = table_of(codec, [shared_reply(client, codec, "u0", [bytes(reversed(BIG))])[0]])
    assert client.fill(second) == {} and client.buffers.reused == 0
    assert bytes(held) == BIG and bytes(second.parts[0][0]) == bytes(reversed(BIG))
    del first, held
    third = table_of(codec, [shared_reply(client, codec, "u0", [BIG])[0]])
    assert client.fill(third) == {} and client.buffers.reused == 1
    assert bytes(third.parts[0][0]) == BIG and os.listdir(tmp_path) == []


def test_a_segment_shorter_than_its_reference_fails_that_engine_not_the_client(client, codec, tmp_path):
    body, ref = shared_reply(client, codec, "u0", [BIG])
    os.truncate(tmp_path / ref["name"], shm.PAGE + 100)  # as a full disk or a rogue process leaves it
    lost = client.fill(table_of(codec, [body]))
    assert "lies outside" in lost[0]
    assert os.listdir(tmp_path) == []


def test_a_gathers_big_arrays_are_joined_into_a_warm_buffer_and_anything_else_is_left_to_ipyparallel():
    import numpy as np

    from ipyparallel_broadcast.client.shared import WarmBuffers

    warm = WarmBuffers(limit=1 << 22)
    parts = [np.full((64, 128), k, dtype=np.float64) for k in range(4)]  # 64 KiB each
    joined = warm.concatenate(parts, least=1 << 16)
    assert joined.shape == (256, 128) and joined.flags.writeable and joined.flags.c_contiguous
    assert (joined == np.concatenate(parts)).all() and warm.kept == 1 << 18
    del joined
    again = warm.concatenate([p + 1 for p in parts], least=1 << 16)
    assert warm.reused == 1 and float(again[-1, -1]) == 4.0
    assert warm.concatenate(parts, least=1 << 20) is None  # small: NumPy's own allocation
    assert warm.concatenate(parts, least=0) is None  # sharing off
    assert WarmBuffers(limit=0).concatenate(parts, least=1) is None  # nothing kept
    for odd in (
        [parts[0], parts[1].astype(np.float32)],  # two dtypes
        [parts[0], parts[1][:, :64]],  # shapes past the first axis differ
        [np.array([None] * 10, dtype=object)],
        [np.float64(1.0)],
        [np.array(5.0)],
        [parts[0].view(np.matrix)],
        [[1, 2], [3]],
        [],
    ):
        assert warm.concatenate(odd, least=1) is None
