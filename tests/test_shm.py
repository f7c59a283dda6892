"""One copy per host on a real cluster: a big push reaches the engines of
this host through one shared-memory segment (the root writes it, the leaves
pass it on), each engine's array is
its own (copy-on-write), small buffers keep the usual path, and no name is
left in /dev/shm."""

import os
import signal

import numpy as np
import pytest
from cluster_util import arrive_and_hold, running_cluster, settled_stats, skip_or_fail, until
from ipyparallel import interactive

from ipyparallel_broadcast.host import shm

pytestmark = pytest.mark.cluster


def _names():
    return sorted(n for n in os.listdir(shm.directory()) if n.startswith(f"ipb-shm-{os.getuid()}-"))


@interactive
def described():
    return big.shape, big.dtype.str, big.flags.writeable, float(big[-1, -1]), list(small)  # noqa: F821


@interactive
def mark():
    import os

    big[0, 0] = os.getpid()  # noqa: F821
    return float(big[0, 0]), float(big[0, 1])  # noqa: F821


@interactive
def total():
    return float(x.sum())  # noqa: F821


@pytest.fixture(scope="module")
def rc():
    with running_cluster(4, 1, 2) as client:
        yield client


@pytest.mark.parametrize("coalescing", [True, False])
def test_big_push_is_shared_once_per_host_and_private_per_engine(rc, coalescing):
    before = {s["node"]: s for s in settled_stats(rc)}
    view = rc.broadcast_view(block=True, coalescing=coalescing)
    data = np.arange(3 << 20, dtype=np.float32).reshape(1024, -1)
    view.push(dict(big=data, small=np.arange(10)))
    assert view.apply(described) == [((1024, 3072), "<f4", True, float(data[-1, -1]), list(range(10)))] * 4
    marks = view.apply(mark)
    assert len({m[0] for m in marks}) == 4 and all(m[1] == 1.0 for m in marks)
    after = {s["node"]: s for s in settled_stats(rc)}
    grew = {
        node: {k: after[node][k] - before[node][k] for k in ("shm_segments", "shm_bytes", "shm_saved")}
        for node in after
    }
    assert grew["root"] == dict(shm_segments=1, shm_bytes=data.nbytes, shm_saved=0)  # written once
    leaves = [node for node in after if node != "root"]
    assert len(leaves) == 2 and all(after[node]["shm_local"] == 2 for node in leaves)
    assert all(grew[node] == dict(shm_segments=0, shm_bytes=0, shm_saved=2 * data.nbytes) for node in leaves)
    assert _names() == []


def _pss(pids) -> int:
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            total += sum(int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:"))
    return total


def test_the_engines_and_relays_of_a_host_hold_one_copy(rc):
    view = rc.broadcast_view(block=True)
    pids = view.apply(os.getpid) + [s["pid"] for s in rc.broadcast_stats()]
    data = np.ones(8 << 20)  # 64 MiB
    before = _pss(pids)
    view["x"] = data
    assert view.apply(total) == [float(data.size)] * 4  # every engine read every page
    grew = _pss(pids) - before
    view.execute("del x")
    assert grew <= 1.3 * data.nbytes, f"{grew / data.nbytes:.2f} copies"  # 4 without sharing


def test_values_below_the_threshold_take_the_usual_path(rc):
    before = sum(s.get("shm_segments", 0) for s in settled_stats(rc))
    view = rc.broadcast_view(block=True)
    view["x"] = np.ones(shm.THRESHOLD // 8 - 1)
    assert view.apply(total) == [shm.THRESHOLD // 8 - 1.0] * 4
    assert sum(s.get("shm_segments", 0) for s in settled_stats(rc)) == before


@interactive
def blocks(rank):
    import numpy as np

    return dict(rank=rank, block=np.full((64, 1024), rank, dtype=np.float64), small=[rank])


@pytest.mark.parametrize("coalescing", [True, False, "batch"])
def test_big_replies_come_back_through_shared_memory_and_leave_no_name(rc, coalescing):
    """Engines of the client's host put big reply buffers (512 KiB here) in one
    segment each; the relays carry names; the client maps and unlinks them."""
    from ipyparallel_broadcast import Batch

    view = rc.broadcast_view(block=True, coalescing=Batch(2) if coalescing == "batch" else coalescing)
    before = rc._shared.segments_read
    got = view.apply(blocks, 3)
    assert [(r["rank"], r["block"].shape, float(r["block"].sum()), r["small"]) for r in got] == [
        (3, (64, 1024), 3.0 * 64 * 1024, [3])
    ] * 4
    assert rc._shared.segments_read - before == 4  # every engine's block came by shared memory
    got[0]["block"][0, 0] = -1  # the client's own copy (copy-on-write)
    view.scatter("part", np.arange(4 * 64 * 1024, dtype=np.float64).reshape(4 * 64, 1024))
    joined = rc._shared.buffers.joined
    gathered = view.gather("part")
    assert gathered.shape == (256, 1024) and float(gathered[-1, -1]) == 4 * 64 * 1024 - 1.0
    assert rc._shared.buffers.joined == joined + 1  # into the client's warm buffers
    assert rc._shared.segments_read - before == 8
    assert _names() == []


def test_big_replies_are_read_into_warm_buffers_and_never_into_one_a_result_holds(rc):
    """A result the user keeps is never overwritten; once it and the recent
    calls let a buffer go, the next big reply is read into it."""
    view = rc.broadcast_view(block=True)
    kept_calls = rc._calls.kept
    rc._calls.kept = 1  # (the recent calls hold their results too)
    try:
        mine = view.apply(blocks, 5)
        reused = rc._shared.buffers.reused
        for rank in (6, 7, 8):
            got = view.apply(blocks, rank)
            assert [float(r["block"].sum()) for r in got] == [rank * 64.0 * 1024] * 4
        assert rc._shared.buffers.reused - reused >= 4  # rank 8's blocks went into rank 6's buffers
        assert [float(r["block"].sum()) for r in mine] == [5 * 64.0 * 1024] * 4  # untouched
    finally:
        rc._calls.kept = kept_calls
    assert _names() == []


def test_a_client_on_another_host_or_with_sharing_off_gets_the_bytes(rc):
    view = rc.broadcast_view(block=True)
    before, here = rc._shared.segments_read, rc._shared.here
    try:
        rc._shared.ask(shm.REPLY_THRESHOLD, "another host")  # as a client elsewhere says
        assert [float(r["block"].sum()) for r in view.apply(blocks, 1)] == [64.0 * 1024] * 4
        rc._shared.ask(shm.REPLY_THRESHOLD, here)
        rc.shared_reply_threshold = 0
        assert [float(r["block"].sum()) for r in view.apply(blocks, 2)] == [2.0 * 64 * 1024] * 4
    finally:
        rc.shared_reply_threshold = shm.REPLY_THRESHOLD
    assert rc._shared.segments_read == before
    assert [float(r["block"].sum()) for r in view.apply(blocks, 1)] == [64.0 * 1024] * 4
    assert rc._shared.segments_read == before + 4
    assert _names() == []


@interactive
def mapped():
    with open("/proc/self/maps") as f:
        return sum("ipb-shm-" in line for line in f)


@pytest.mark.parametrize("coalescing", [True, False])
def test_a_pushed_value_is_let_go_at_del_with_no_later_call(rc, coalescing):
    view = rc.broadcast_view(block=True, coalescing=coalescing)
    view.push(dict(mapped=mapped))
    view.push(dict(big=np.ones(shm.THRESHOLD // 4)))
    view.execute("before = mapped(); del big; after = mapped()")  # not an apply: see kernel.apply_request
    assert view.pull(["before", "after"]) == [[1, 0]] * 4


def _held_push(rc, folder, data):
    """Engine 0 is busy (held at a gate) when a big push reaches every engine:
    the segment exists and engine 0 has not mapped it. Returns (push, pid 0)."""
    held = rc[rc.ids[0]].apply_async(arrive_and_hold, str(folder))
    until(lambda: len(os.listdir(folder)) == 1, what="engine 0 to be held")
    push = rc.broadcast_view().push(dict(big=data), block=False)
    until(lambda: len(_names()) == 1, what="the segment to be written")
    return push, held, int(os.listdir(folder)[0])


@pytest.mark.parametrize("victim", ["engine", "root", "leaf"])
def test_a_kill_mid_push_leaves_no_name_and_the_survivors_have_the_value(tmp_path, victim):
    from ipyparallel import error

    data = np.arange(1 << 18, dtype=np.float64)
    with running_cluster(4, 1, 2) as rc:
        push, held, pid = _held_push(rc, tmp_path, data)
        nodes = {s["node"]: s["pid"] for s in rc.broadcast_stats()}
        os.kill({"engine": pid, "root": nodes["root"], "leaf": nodes.get("0")}[victim], signal.SIGKILL)
        if victim == "engine":  # its leaf hears it is gone: the request ends, its writer unlinks
            outcomes = push.get(timeout=60, return_exceptions=True)
            assert isinstance(outcomes[0], error.RemoteError) and outcomes[1:] == [None] * 3
        elif victim == "root":  # the client sends the push again: every engine has it (issue 73)
            (tmp_path / "go").touch()
            assert push.get(timeout=60) == [None] * 4
        else:  # the dead node's segment goes when the controller restarts it
            with pytest.raises(error.CompositeError):
                push.get(timeout=60)
        until(lambda: _names() == [], what="no segment name left")
        (tmp_path / "go").touch()
        view = rc.broadcast_view(block=True)
        until(lambda: len(rc.ids) == (3 if victim == "engine" else 4), what="the hub to settle")
        view.targets = rc.ids

        def serves():  # engines reconnect to a restarted node by themselves (zmq)
            try:
                return view.apply(os.getpid) is not None
            except error.CompositeError:
                return False

        until(serves, what="the tree to serve every engine again")
        view["x"] = data
        assert view.apply(total) == [float(data.sum())] * len(rc.ids)
        assert _names() == []


def test_a_dev_shm_too_small_falls_back_to_copies(tmp_path, monkeypatch):
    if os.geteuid() != 0:
        skip_or_fail("mounting a small tmpfs needs root", "the small-tmpfs test (CI runs as root)")
    import subprocess

    small = tmp_path / "shm"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=1777", "tmpfs", str(small)], check=True)
    try:
        monkeypatch.setenv("IPB_SHM_DIR", str(small))  # the cluster's processes inherit it
        with running_cluster(2, 0, 2) as client:
            view = client.broadcast_view(block=True)
            data = np.arange(1 << 19, dtype=np.float64)  # 4 MiB: more than the file system holds
            view["x"] = data
            assert view.apply(total) == [float(data.sum())] * 2
            (root,) = settled_stats(client)
            assert root["shm_local"] == 2 and root["shm_segments"] == 0  # local, yet copies
            assert os.listdir(small) == []
    finally:
        subprocess.run(["umount", str(small)], check=True)
