"""The compose runtime's parts, in this process and in plain helper processes
(no cluster): lock-file slots and busy marks, the token pool, budgets, regions."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np  # noqa: F401  (loads OpenBLAS, whose pool the regions set)
import pytest
from cluster_util import until
from hypothesis import given
from hypothesis import strategies as st

from ipyparallel_broadcast.engine.compose import host as H
from ipyparallel_broadcast.engine.compose import limits as L
from ipyparallel_broadcast.engine.compose.errors import ComposeError
from ipyparallel_broadcast.engine.compose.runtime import Runtime
from ipyparallel_broadcast.engine.compose.tokens import TokenPool
from ipyparallel_broadcast.host import composedir

pytestmark = pytest.mark.cluster

HOLDER = textwrap.dedent(
    """
    import sys, time
    from ipyparallel_broadcast.engine.compose.host import HostDir
    from ipyparallel_broadcast.engine.compose.tokens import TokenPool
    root, key, tokens, busy = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
    d = HostDir(key, root)
    if busy:
        d.enter_busy()
    got = TokenPool(d.path, int(sys.argv[5]), start=d.rank).acquire(tokens)
    print(d.rank, got, flush=True)
    time.sleep(600)
    """
)


@pytest.fixture
def root(tmp_path):
    return str(tmp_path)


@pytest.fixture
def holders(root):
    """Start helper processes that claim a slot, maybe a busy mark, and tokens."""
    procs = []

    def start(key="k", tokens=0, busy=False, size=2):
        p = subprocess.Popen(
            [sys.executable, "-c", HOLDER, root, key, str(tokens), "1" if busy else "0", str(size)],
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(p)
        rank, got = map(int, p.stdout.readline().split())
        return p, rank, got

    yield start
    for p in procs:
        p.kill()
        p.wait()


def kill(p):
    p.send_signal(signal.SIGKILL)
    p.wait()


def test_slots_rank_from_hint_or_lowest_free(root, holders):
    _, r0, _ = holders()
    assert r0 == 0
    d = H.HostDir("k", root, rank_hint=0)  # 0 is taken: the lowest free slot
    assert d.rank == 1
    e = H.HostDir("k", root, rank_hint=5)
    assert e.rank == 5
    assert d.live_engines() == e.live_engines() == 3
    assert H.HostDir("other", root).rank == 0  # another cluster, other slots


def test_a_killed_engine_frees_its_slot_and_busy_mark(root, holders):
    d = H.HostDir("k", root)
    p, _, _ = holders(busy=True)
    assert d.live_engines() == 2
    assert d.busy_engines() == 2
    kill(p)
    assert d.live_engines() == 1
    assert d.busy_engines() == 1


def test_the_last_engine_out_removes_the_directory(root, holders):
    a, b = H.HostDir("k", root), H.HostDir("k", root)
    p, _, _ = holders()
    assert H.survey("k", root)["slot"] == 3
    a.close()
    kill(p)  # a killed engine leaves nothing to wait for
    assert os.path.isdir(b.path)
    b.close()
    assert not os.path.exists(b.path)
    assert H.survey("k", root) == {"slot": 0, "busy": 0, "token": 0, "tokens": 0}
    c = H.HostDir("k", root)  # a newcomer makes it again
    assert c.rank == 0 and os.path.isdir(c.path)


def test_a_sweep_removes_only_the_directories_no_engine_is_in(root, holders):
    live = H.HostDir("live", root)
    holders(key="held")  # another process's engine
    p, _, _ = holders(key="killed")
    kill(p)
    os.makedirs(os.path.join(root, "ipb-compose-not-a-uid-x"))  # not this user's pattern: untouched
    assert composedir.sweep_unused(root) == ["killed"]
    assert sorted(os.listdir(root)) == sorted(
        [os.path.basename(live.path), os.path.basename(composedir.host_path("held", root)), "ipb-compose-not-a-uid-x"]
    )
    assert H.HostDir("killed", root).rank == 0  # a newcomer makes it again


def test_busy_marks_nest(root, holders):
    d = H.HostDir("k", root)
    p, _, _ = holders()
    other = H.HostDir("k", root)
    d.enter_busy()
    d.enter_busy()
    d.leave_busy()
    assert other.busy_engines() == 2
    d.leave_busy()
    assert other.busy_engines() == 1


def test_tokens_never_exceed_the_pool(root):
    a, b = TokenPool(root, 3), TokenPool(root, 3, start=1)
    assert a.acquire(2) == 2
    assert b.acquire(5) == 1
    assert a.free() == b.free() == 0
    assert b.acquire(1) == 0
    a.release(1)
    assert b.free() == 1 and b.acquire(1) == 1
    a.release(1)
    b.release(2)
    assert a.free() == 3


def test_a_probe_never_drops_a_claim_of_ours(root):
    """The watcher thread probes (``free``) while the main thread claims: a
    probe on the claiming file would turn the claim shared and then unlock it."""
    mine, other = TokenPool(root, 2), TokenPool(root, 2)
    assert mine.acquire(1) == 1
    assert mine.files.held_elsewhere(mine.held[0])  # as a probe racing the claim would
    assert other.acquire(2) == 1 and mine.free() == 0
    mine.release(1)
    assert mine.free() == 1


def test_tokens_come_back_when_their_holders_are_killed(root, holders):
    pool = TokenPool(os.path.join(root, f"ipb-compose-{os.getuid()}-k"), 4)
    procs = [holders(tokens=2, size=4) for _ in range(2)]
    assert [got for _, _, got in procs] == [2, 2]
    assert pool.free() == 0 and pool.acquire(1) == 0
    for p, _, _ in procs:
        kill(p)
    assert pool.free() == 4
    assert pool.acquire(4) == 4


def test_blocking_acquire_waits_for_a_token(root, holders):
    pool = TokenPool(os.path.join(root, f"ipb-compose-{os.getuid()}-k"), 1)
    p, _, got = holders(tokens=1, size=1)
    assert got == 1 and pool.acquire(1) == 0
    import threading

    threading.Timer(0.2, kill, [p]).start()
    assert pool.acquire_blocking(1) == 1


@given(
    cores=st.lists(st.integers(0, 255), min_size=1, max_size=64, unique=True),
    engines=st.integers(1, 64),
    factor=st.sampled_from([1, 2]),
)
def test_core_slices_share_cores_evenly(cores, engines, factor):
    width = max(1, len(cores) * factor // engines)
    slices = [L.core_slice(cores, r, width) for r in range(engines)]
    assert all(len(set(s)) == len(s) == min(width, len(cores)) for s in slices)
    uses = [sum(c in s for s in slices) for c in cores]
    assert max(uses) - min(uses) <= 1  # no core is used by two more engines than another


def test_env_limits_and_numba_cap():
    env = {}
    L.set_env(3, cap=8, env=env)
    assert env["OPENBLAS_NUM_THREADS"] == env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "3"
    assert env["NUMBA_NUM_THREADS"] == "8"


def test_launcher_hints():
    assert H.launcher_hint({"IPB_COMPOSE_ENGINES": "4", "IPB_COMPOSE_RANK": "2"}) == (4, 2)
    assert H.launcher_hint({"MPI_LOCALNRANKS": "3", "MPI_LOCALRANKID": "0"}) == (3, 0)
    assert H.launcher_hint({"OMPI_COMM_WORLD_LOCAL_SIZE": "x", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}) is None
    assert H.launcher_hint({}) is None


@pytest.fixture
def rt(root, monkeypatch):
    """A fresh runtime; its environment changes are undone after the test."""
    for var in L.ENV_VARS + ("IPB_COMPOSE_ENGINES", "IPB_COMPOSE_RANK"):
        monkeypatch.delenv(var, raising=False)
    r = Runtime()
    before = r.pools.get()
    yield r
    r.configure("default", root=root, key="k") if r.host else None
    r.pools.set(before)


def blas_threads(rt):
    return rt.pools.get()[0]


def test_static_budget_from_engines_on_host(rt, root, holders):
    holders(), holders(), holders()
    status = rt.configure("static", key="k", root=root)
    assert status["engines_on_host"] == 4
    assert status["budget"] == max(1, rt.cores // 4)
    assert blas_threads(rt) == status["budget"]
    assert os.environ["OPENBLAS_NUM_THREADS"] == str(status["budget"])
    assert rt.configure("static", factor=4, engines=2)["budget"] == rt.cores * 2


def test_nested_region_runs_one_thread_and_restores(rt, root):
    rt.configure("counting", key="k", root=root)
    with rt.threads() as n:
        assert n == rt.cores and blas_threads(rt) == n
        with rt.threads() as m:
            assert m == 1 and blas_threads(rt) == 1
        assert blas_threads(rt) == n
    assert blas_threads(rt) == rt.budget
    assert rt.counting.tokens.free() == rt.cores and rt.nested == 1


def test_counting_takes_a_fair_share_of_free_tokens(rt, root, holders):
    rt.configure("counting", key="k", root=root, engines=1)
    size = rt.cores
    _, _, got = holders(tokens=1, busy=True, size=size)  # another busy engine with a token
    with rt.threads() as n:
        assert n == max(1, min(size - 1, -(-size // 2)))
    for _ in range(size - 1):
        holders(tokens=1, busy=True, size=size)  # every token taken
    with rt.threads(block=False) as n:
        assert n == 1 and rt.counting.tokens.held == []  # runs anyway, on one thread


def test_rebalancing_follows_the_busy_engines(rt, root, holders):
    rt.configure("counting", key="k", root=root, engines=1, rebalance=0, settle=0)  # by hand
    counting = rt.counting
    with rt.threads() as n:
        assert n == rt.cores == blas_threads(rt)
        p, _, _ = holders(busy=True, size=rt.cores)  # another engine starts work
        assert counting.rebalance() == (rt.cores > 1)
        fair = -(-rt.cores // 2)
        assert counting.current.held == counting.current.threads == fair == blas_threads(rt)
        assert not counting.rebalance()  # settled
        kill(p)  # and is gone: the whole host again
        counting.rebalance()
        assert counting.current.held == rt.cores == blas_threads(rt)
    assert counting.tokens.held == [] and blas_threads(rt) == rt.budget
    assert counting.stats["rebalanced"] == (2 if rt.cores > 1 else 0)


def test_the_rebalancer_runs_while_a_region_is_open(rt, root, holders):
    rt.configure("counting", key="k", root=root, engines=1, rebalance=0.005)
    with rt.threads():
        holders(busy=True, tokens=0, size=rt.cores)
        deadline = time.monotonic() + 10
        while rt.counting.current.held != -(-rt.cores // 2):
            assert time.monotonic() < deadline, "the rebalancer never gave a token back"
            time.sleep(0.01)


def test_a_failed_rebalance_is_logged_not_raised(rt, root, monkeypatch, caplog):
    rt.configure("counting", key="k", root=root, engines=1, rebalance=0)
    counting = rt.counting

    def broken():
        raise OSError("lock file gone")

    monkeypatch.setattr(counting, "rebalance", broken)
    with rt.threads() as n, caplog.at_level("ERROR"):
        assert counting._in_main(None) == 0  # what the pending call returns to CPython
    assert f"rebalance failed; it keeps {n} threads" in caplog.text
    assert "lock file gone" in caplog.text


def _blocked_on_wake(counting) -> bool:
    """The watcher is in ``_wake.wait()`` with no timeout, and nothing has set
    ``_wake``: it cannot run again until a region wakes it."""
    frame = sys._current_frames().get(counting._thread.ident)
    while frame is not None and frame.f_back is not None:
        if frame.f_code.co_name == "wait" and frame.f_back.f_code.co_name == "_watch":
            return frame.f_locals.get("timeout", 0) is None and not counting._wake.is_set()
        frame = frame.f_back
    return False


def test_the_watcher_blocks_when_turned_off_or_idle(rt, root):
    rt.configure("counting", key="k", root=root, rebalance=0.005)
    with rt.threads():
        assert not _blocked_on_wake(rt.counting)  # watching the open region
    until(lambda: _blocked_on_wake(rt.counting), timeout=30, what="the idle watcher to block")
    watcher = rt.counting._thread
    rt.configure("counting", rebalance=0.005)
    with rt.threads():
        pass
    rt.configure("counting", rebalance=0)  # turned off while lingering after a region
    until(lambda: _blocked_on_wake(rt.counting), timeout=30, what="the watcher to block")
    assert rt.counting._thread is watcher and watcher.is_alive()


def test_static_region_leaves_the_budget(rt, root):
    rt.configure("static", key="k", root=root, engines=2)
    with rt.threads() as n:
        assert n == rt.budget == blas_threads(rt)


def test_bad_settings_are_refused(rt, root):
    with pytest.raises(ComposeError, match="one of"):
        rt.configure("fast", key="k", root=root)
    with pytest.raises(ComposeError, match="factor"):
        rt.configure("static", key="k", root=root, factor=0)
    with pytest.raises(ComposeError, match="static mode only"):
        rt.configure("counting", key="k", root=root, pin=True)
    assert rt.mode == "default"


def test_tbb_checks_name_what_they_found():
    from importlib.util import find_spec

    from ipyparallel_broadcast.engine.compose import tbbmode

    found = tbbmode.problems()
    if find_spec("tbb") is None:
        assert found == ["tbb4py is not installed (pip install tbb4py)"]
        return
    irml = tbbmode.find_irml()
    assert irml is not None
    missing = tbbmode.missing_symbols(irml)
    if missing:  # the broken wheels: named, with what is missing
        assert any("does not export" in p and missing[0] in p for p in found)
    layers = tbbmode.blas_layers()
    if not any(layer == "tbb" for _, layer in layers):
        assert any("cannot run on TBB" in p and layers[0][0] in p for p in found)
