"""Shared memory, pure: segments written once, mapped copy-on-write, counted
down and unlinked by the last mapper, swept when their relay is gone, and
references that are forged or malformed refused."""

import os
import subprocess
import sys

import numpy as np
import pytest

from ipyparallel_broadcast.host import shm
from ipyparallel_broadcast.wire import protocol as P

pytestmark = pytest.mark.pure


def sign(parts):
    return b"k" + bytes(len(parts[0]) % 7)


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("IPB_SHM_DIR", str(tmp_path))
    return shm.ShmStore()


def request_frames(ref, bufs):
    return [b"leaf", b"r1", ref.frame(sign), P._DELIM, b"sig", b"{}", b"{}", b"{}", b"{}"] + bufs


def test_each_engine_maps_copy_on_write_and_the_last_unlinks(store, tmp_path):
    a = np.asfortranarray(np.arange(3 << 18, dtype=np.int32).reshape(3, -1))
    small = b"x" * 10
    ref = store.put([(1, memoryview(np.ascontiguousarray(a)))], readers=3)
    frames = request_frames(ref, [small, b""])
    got = [shm.expand(list(frames), 2, sign) for _ in range(2)]
    assert (tmp_path / ref.name).exists()  # one engine yet to map
    got.append(shm.expand(list(frames), 2, sign))
    assert not (tmp_path / ref.name).exists()
    views = [np.frombuffer(g[-1], dtype=np.int32) for g in got]
    assert all(len(g) == len(frames) - 1 and P.as_bytes(g[-2]) == small for g in got)
    assert all((v == np.ascontiguousarray(a).ravel()).all() for v in views)
    views[0][:] = -1  # private: the others do not see it
    assert views[1][0] == 0 and views[2][-1] == a.size - 1
    assert views[0].ctypes.data % shm.PAGE == 0


def test_the_relay_unlinks_what_no_engine_mapped(store, tmp_path):
    ref = store.put([(0, b"y" * (1 << 20))], readers=2)
    store.drop(ref)
    assert os.listdir(tmp_path) == []
    with pytest.raises(shm.ShmError, match="is gone"):
        shm.expand(request_frames(ref, [b""]), 2, sign)


def test_forged_and_malformed_references_are_refused(store):
    ref = store.put([(0, b"z" * 4096)], readers=1)
    frames = request_frames(ref, [b""])
    with pytest.raises(shm.ShmError, match="bad signature"):
        shm.expand(frames, 2, lambda parts: b"other")
    for name, bufs in (("../etc/passwd", [[0, 4096, 1]]), (ref.name, [[0, 100, 1]]), (ref.name, [[5, 4096, 1]])):
        forged = shm.Reference(name, bufs)
        with pytest.raises(shm.ShmError):
            shm.expand([b"leaf", b"r1", forged.frame(sign)] + frames[3:], 2, sign)


def test_segments_are_private_to_the_user(store, tmp_path):
    ref = store.put([(0, b"a" * 10)], readers=1)
    assert (tmp_path / ref.name).stat().st_mode & 0o777 == 0o600
    assert f"-{os.getpid()}-" in ref.name and len(ref.name.rsplit("-", 1)[1]) == 16


def test_sweep_removes_only_dead_relays_segments(store, tmp_path):
    mine = store.put([(0, b"a")], readers=1)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
    stale = tmp_path / f"ipb-shm-{os.getuid()}-{dead}-0123456789abcdef"
    stale.write_bytes(b"")
    other = tmp_path / "unrelated"
    other.write_bytes(b"")
    assert shm.sweep() == [stale.name]
    assert sorted(os.listdir(tmp_path)) == sorted([mine.name, "unrelated"])


def test_no_room_falls_back_and_logs_once(monkeypatch, caplog, tmp_path):
    store = shm.ShmStore(root=str(tmp_path / "missing"))
    assert store.put([(0, b"a")], readers=1) is None
    assert store.put([(0, b"a")], readers=1) is None
    assert sum("logged once" in r.getMessage() for r in caplog.records) == 1


def test_relays_of_one_host_pass_one_segment_down_and_its_writer_unlinks_it(store, tmp_path):
    from jupyter_client.session import Session

    from ipyparallel_broadcast.relay.pending import Pending
    from ipyparallel_broadcast.relay.sharing import Sharing

    codec = P.Codec(Session(key=b"k"))
    big, small = np.arange(1 << 18, dtype=np.float64), b"s" * 10
    inner = [b"sig", b"{}", b"{}", b"{}", b"{}", small, memoryview(big)]
    root, leaf = Sharing(codec, store), Sharing(codec, shm.ShmStore())
    up = Pending(key="r0", msg_id="m", stream=False, route=[], inner=list(inner))
    root.pass_down(up)
    content, frames = up.request_for([0, 1], None, up.shared)
    assert frames[5] == small and frames[6] == b"" and len(os.listdir(tmp_path)) == 1
    down = Pending(key="r0", msg_id="m", stream=False, route=[], inner=list(frames))
    leaf.joined("u0", leaf.store.ident)  # a local engine; u1 is not
    leaf.take(down, content["shm"])
    assert np.frombuffer(down.inner[6], dtype=np.float64).tolist() == big.tolist()  # for u1: bytes
    leaf.prepare(down, [0, 1], {0: "u0", 1: "u1"})
    assert down.shared.readers == {"u0"} and leaf.frames_for(down, "u1", b"r0") is None
    to_u0 = leaf.frames_for(down, "u0", b"r0")
    leaf.release(down)  # not the writer: the name stays for the other leaves
    assert len(os.listdir(tmp_path)) == 1
    mapped = shm.expand(to_u0, 2, codec.sign)
    assert np.frombuffer(mapped[-1], dtype=np.float64)[-1] == big[-1]
    assert len(os.listdir(tmp_path)) == 1  # engines of a passed segment do not unlink it
    root.release(up)
    assert os.listdir(tmp_path) == []
    late = Pending(key="r0", msg_id="m", stream=False, route=[], inner=list(frames))
    with pytest.raises(shm.ShmError, match="is gone"):
        leaf.take(late, content["shm"])
    assert root.stats()["shm_bytes"] == big.nbytes and leaf.stats()["shm_saved"] == big.nbytes


# ------------------------------------------------- reduce values, engine to relay
def test_an_engines_reduce_value_is_taken_by_its_relay_writable_and_its_name_gone(store, tmp_path):
    from ipyparallel.serialize import serialize_object

    from ipyparallel_broadcast.wire.reduction import Reduction, decode_engine, engine_value, share_values_with

    writer = shm.value_writer(shm.relay_prefix(), 1 << 16)
    share_values_with(writer)
    try:
        big = engine_value(lambda: np.arange(1 << 14, dtype=float))  # 128 KiB: shared
        small = engine_value(lambda: np.arange(4, dtype=float))  # under the threshold: bytes
    finally:
        share_values_with(None)
    assert big[0] == "shm" and small[0] == "nd"
    assert len(os.listdir(tmp_path)) == 1
    value, owned = decode_engine(serialize_object(big), store.take)
    assert owned and value.flags.writeable and os.listdir(tmp_path) == []
    np.testing.assert_array_equal(value, np.arange(1 << 14, dtype=float))
    r = Reduction("sum")
    r.add([0], value, owned=True)
    r.add([1], np.ones(1 << 14))
    assert r.result() is value  # combined in place: no new array
    np.testing.assert_array_equal(value, np.arange(1 << 14, dtype=float) + 1)


def test_a_relay_takes_only_its_own_reduce_values(store, tmp_path):
    import subprocess

    other = shm.ShmStore().put([(0, b"x" * 8192)], prefix=f"ipb-shm-{os.getuid()}-1-")  # pid 1's: alive
    with pytest.raises(shm.ShmError, match="not a reduce value for this relay"):
        store.take(other.content())
    assert other.name in os.listdir(tmp_path)  # someone else's: left alone
    mine = shm.ShmStore().put([(0, b"y" * 8192), (1, b"z")], prefix=shm.relay_prefix())
    with pytest.raises(shm.ShmError):
        store.take(mine.content())  # one buffer only
    for bad in ({"name": "../etc/passwd", "bufs": [[0, 4096, 1]]}, {"name": 3}, [], {"bufs": []}):
        with pytest.raises(shm.ShmError):
            store.take(bad)
    gone = subprocess.Popen(["true"])
    gone.wait()  # a relay that has died: its name is taken (an engine may still follow its greeting)
    late = shm.ShmStore().put([(0, b"v" * 8192)], prefix=f"ipb-shm-{os.getuid()}-{gone.pid}-")
    assert bytes(store.take(late.content())[:1]) == b"v" and late.name not in os.listdir(tmp_path)
    ref = shm.ShmStore().put([(0, b"w" * 100)], prefix=shm.relay_prefix())
    with pytest.raises(shm.ShmError, match="outside"):
        store.take(dict(name=ref.name, bufs=[[0, 4096, 1 << 20]]))  # past the segment's end
    assert ref.name not in os.listdir(tmp_path)  # taken (and refused): its name goes all the same


@pytest.mark.parametrize("prefix, threshold", [("ipb-shm-1-2-", 0), ("/tmp/x-", 4), ("ipb-shm-a-2-", 4), (None, 4)])
def test_an_engine_ignores_a_malformed_greeting(prefix, threshold):
    assert shm.value_writer(prefix, threshold) is None
