"""Shared memory, pure: segments written once, mapped copy-on-write, counted
down and unlinked by the last mapper, swept when their relay is gone, and
references that are forged or malformed refused."""

import os
import subprocess
import sys

import numpy as np
import pytest
from ipyparallel.serialize import serialize_object

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

    from ipyparallel_broadcast.relay.inflight import Pending
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


# ------------------------------------------- reduce values, combined by their engines
def test_engines_combine_the_values_they_hold_into_one_segment_in_turn(store, tmp_path):
    from ipyparallel_broadcast.engine.holds import Holds
    from ipyparallel_broadcast.wire.reduction import Held, Reduction, decode_engine, engine_value, hold_values_with

    rng = np.random.default_rng(5)
    values = [rng.standard_normal(1 << 14) * 10.0 ** rng.integers(-8, 8) for _ in range(4)]  # order matters
    engines = [Holds(shm.relay_prefix(), 1 << 16) for _ in values]
    held = []
    for holds, v in zip(engines, values):
        hold_values_with(holds.hold)
        try:
            held.append(decode_engine(serialize_object(engine_value(lambda v=v: v))))
            small = engine_value(lambda: np.arange(4, dtype=float))  # under the threshold: bytes
        finally:
            hold_values_with(None)
        assert small[0] == "nd" and holds.holding
    assert all(isinstance(h, Held) and h.nbytes == 1 << 17 for h in held)
    ref, (view,) = store.reserve([(0, 1 << 17)])
    for i, (holds, h) in enumerate(zip(engines, held)):
        turn = dict(req="r1", round=1, token=h.token, ref=ref.content(), op="sum", dtype=h.dtype, first=i == 0)
        assert holds.turn(turn) == dict(req="r1", round=1, token=h.token, ok=True)
    store.drop(ref)
    assert os.listdir(tmp_path) == []
    combined = held[0].value(view)
    one_pass = Reduction("sum")
    for eid, v in enumerate(values):
        one_pass.add([eid], v.copy())
    assert combined.tobytes() == one_pass.result().tobytes()  # the same order, to the bit
    for holds, h in zip(engines, held):
        holds.release([h.token])
        assert not holds.holding


def test_a_turn_is_refused_for_a_segment_not_its_relays_or_a_value_it_does_not_hold(store):
    from ipyparallel_broadcast.engine.holds import Holds

    holds = Holds(shm.relay_prefix(), 16)
    token = holds.hold(np.ones(8))
    ref, _ = store.reserve([(0, 64)])
    other = shm.ShmStore().put([(0, b"x" * 64)], prefix=f"ipb-shm-{os.getuid()}-1-")
    base = dict(req="r1", round=1, token=token, ref=ref.content(), op="sum", dtype=np.ones(1).dtype.str, first=True)
    for bad in (
        dict(token="7"),
        dict(ref=other.content()),
        dict(ref=dict(name="../etc/passwd", bufs=[[0, 4096, 64]])),
        dict(ref=dict(ref.content(), bufs=[[0, 4096, 1 << 20]])),
        dict(op="mean"),
        dict(dtype="<i8"),
    ):
        assert "error" in holds.turn(dict(base, **bad)), bad
    assert holds.turn(base)["ok"] is True


@pytest.mark.parametrize("prefix, threshold", [("ipb-shm-1-2-", 0), ("/tmp/x-", 4), ("ipb-shm-a-2-", 4), (None, 4)])
def test_an_engine_ignores_a_malformed_greeting(prefix, threshold):
    from ipyparallel_broadcast.engine.holds import Holds

    assert Holds.from_greeting(dict(prefix=prefix, threshold=threshold)) is None
