"""An engine dies mid-request, in every operation and reply mode, both ways:
its kernel is SIGKILLed and the nanny reports it, or kernel and nanny die
together (host loss: only heartbeats tell). Survivors' results arrive, the
dead engine gives an EngineError in its place, and no node keeps state for
the request. (Host loss with the default heartbeats: test_reliability.)"""

import os
import signal

import ipyparallel as ipp
import psutil
import pytest
from cluster_util import arrived, running_cluster, settled_stats, until
from ipyparallel import error

import ipyparallel_broadcast as ipb

pytestmark = pytest.mark.cluster

MODES = {"coalescing": True, "streaming": False, "partial": ipb.Batch(2)}
N = 4  # engines per trial


@pytest.fixture(scope="module")
def rc():
    with running_cluster(N + 2, 1, 2) as client:
        yield client


SPARE = 6  # engines started at once when the killed ones run the cluster low (one start, not one a trial)


def fresh_targets(rc):
    """N live engines, the newest; once fewer than N + 1 are left, the
    cluster is topped up to N + SPARE in one start."""
    if len(rc.ids) < N + 1:
        rc.cluster.start_engines_sync(N + SPARE - len(rc.ids))
        rc.wait_for_engines(N + SPARE, timeout=60)
    return rc.ids[-N:]


@ipp.interactive
def slow(x=1):
    """Say it started (a file named by the pid in the pushed ``arrivals``), then take a while."""
    import os
    import time

    open(os.path.join(arrivals, str(os.getpid())), "w").close()  # noqa: F821
    time.sleep(1.5)
    return x


def kill(pid, death):
    """``kernel``: the nanny sees it die and tells the hub; ``host``: the
    nanny dies with it, so the hub learns from missed heartbeats."""
    victim = psutil.Process(pid)
    for proc in (victim.children(recursive=True) if death == "host" else []) + [victim]:
        proc.kill()


def start(op, view):
    """Start ``op`` on the view, the engines still busy when the victim dies."""
    if op == "apply":
        return view.apply_async(slow, 1)
    if op == "execute":
        started = "open(os.path.join(arrivals, str(os.getpid())), 'w').close()"
        return view.execute(f"import os, time; {started}; time.sleep(1.5); y = 1", block=False)
    if op == "scatter":
        view.apply_async(slow)  # the push queues behind it
        return view.scatter("part", list(range(2 * N)), block=False)
    if op == "map":
        return view.map_async(slow, range(N))
    if op == "reduce":
        return view.reduce(slow, 1, op="sum", block=False)
    raise ValueError(op)


@pytest.mark.parametrize("death", ["kernel", "host"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", ["apply", "execute", "scatter", "map", "reduce"])
def test_engine_killed_mid_request(rc, op, mode, death, tmp_path):
    targets = fresh_targets(rc)
    view = rc.broadcast_view(targets, coalescing=MODES[mode])
    pids = view.apply_sync(os.getpid)
    view.push({"arrivals": str(tmp_path)}, block=True)
    ar = start(op, view)
    until(lambda: pids[1] in arrived(tmp_path), what="the request running on the victim")
    kill(pids[1], death)  # targets[1] dies with the request running
    with pytest.raises(error.CompositeError) as info:
        ar.get(timeout=60)
    assert [e[0] for e in info.value.elist] == ["EngineError"]
    if op == "reduce":
        assert info.value.partial == N - 1  # what the three survivors combined
        outcomes = None
    elif op == "map":  # one chunk per engine, the dead one's an error
        outcomes = info.value.results
        assert [r for i, r in enumerate(outcomes) if i != 1] == [[0], [2], [3]]
    else:
        outcomes = ar.get(return_exceptions=True)
        assert info.value.results == outcomes
        if op == "apply":
            assert [r for i, r in enumerate(outcomes) if i != 1] == [1] * (N - 1)
    if outcomes is not None:
        dead = [i for i, r in enumerate(outcomes) if isinstance(r, Exception)]
        assert dead == [1] and outcomes[1].ename == "EngineError"
    assert [n["pending"] for n in settled_stats(rc)] == [0] * (1 + 2)  # root + 2 leaves
    until(lambda: targets[1] not in rc.ids, what="the dead engine unregistered")  # (the next trial's targets)


def test_dead_or_unknown_targets_are_refused_up_front(rc):
    targets = fresh_targets(rc)
    pid = rc[targets[0]].apply_sync(os.getpid)
    os.kill(pid, signal.SIGKILL)
    until(lambda: targets[0] not in rc.ids, what="the dead engine unregistered")
    pending = set(rc._calls.live)
    refused = r"is not registered: it died or never registered"
    stale = rc.broadcast_view(targets[1:])
    stale.targets = targets  # set while the dead engine was still listed
    with pytest.raises(IndexError, match=refused):
        stale.apply_sync(os.getpid)
    for bad in ([targets[0]], [targets[1], targets[0]], [10_000]):
        with pytest.raises(IndexError, match=refused):
            rc.broadcast_view(bad)
    assert set(rc._calls.live) <= pending  # nothing was sent
    assert len(rc.broadcast_view(targets[1:]).apply_sync(os.getpid)) == N - 1


def heartbeat_state():
    """Engine side: the engine's last heartbeat check and how many it missed."""
    from traitlets.config import Application

    app = Application.instance()
    return app._hb_last_monitored, app._hb_missed_beats


def test_engines_read_the_hubs_heartbeat_when_they_check():
    """Engines read the hub's pings only when they check (not on each ping,
    ``BroadcastEngine._hb_monitor``): no check misses while pings come."""
    with running_cluster(2, 1, 2) as rc:
        view = rc.broadcast_view()
        checks = set()
        while len(checks) < 3 * 2:  # three checks each (every period + 0.5 s)
            for checked, missed in view.apply_sync(heartbeat_state):
                assert missed == 0
                checks.add(checked)


def test_an_engine_killed_holding_a_big_value_for_its_host_is_named_and_the_others_values_come(rc, tmp_path):
    import numpy as np

    targets = fresh_targets(rc)
    view = rc.broadcast_view(targets)
    view.scatter("rank", list(range(N)), flatten=True, block=True)
    pids = view.apply_sync(os.getpid)
    go = tmp_path / "go"

    def value(go=str(go)):
        import os
        import time

        import numpy as np

        while rank != 1 and not os.path.exists(go):  # noqa: F821  (every engine but the victim waits)
            time.sleep(0.01)
        return np.full(1 << 18, rank + 1.0)  # noqa: F821  (2 MiB: held for its relay's segment)

    ar = view.reduce(ipp.interactive(value), op="sum", block=False)

    def held():
        return sum(node.get("held_values") or 0 for node in rc.broadcast_stats())

    until(lambda: held() >= 1, what="the victim's value held, its host waiting")
    assert held() == 1
    kill(pids[1], "kernel")
    until(lambda: targets[1] not in rc.ids, what="the dead engine unregistered")
    go.touch()
    with pytest.raises(error.CompositeError) as info:
        ar.get(timeout=60)
    assert [e[0] for e in info.value.elist] == ["EngineError"]
    assert "before its value was combined" in str(info.value.elist[0][1])
    np.testing.assert_array_equal(info.value.partial, np.full(1 << 18, 1.0 + 3.0 + 4.0))
    assert [n["pending"] for n in settled_stats(rc)] == [0] * (1 + 2) and held() == 0


def test_an_engine_the_hub_dropped_while_it_was_paused_exits_when_it_resumes(rc):
    """Paused past its heartbeats, an engine is dropped by the hub; resumed,
    its heart beats again and the hub tells it so (``controller.dropped``):
    it exits, as a lost engine should, rather than live on unregistered."""
    from cluster_util import process_gone, until

    targets = fresh_targets(rc)
    victim = targets[0]
    pid = rc[victim].apply_sync(os.getpid)
    os.kill(pid, signal.SIGSTOP)
    try:
        until(lambda: victim not in rc.ids, timeout=30, what="the hub to drop the paused engine")
    finally:
        os.kill(pid, signal.SIGCONT)
    until(lambda: process_gone(pid), timeout=30, what="the dropped engine to exit")
    assert len(rc.broadcast_view(targets[1:]).apply_sync(os.getpid)) == N - 1
