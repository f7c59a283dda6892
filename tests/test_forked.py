"""Engines forked from one template process (``ipyparallel_broadcast.engine.forked``),
on a real cluster: each is a whole engine with its own nanny, rank and
random stream; signals, deaths and shutdown work as for fresh engines."""

import os
import signal

import psutil
import pytest
from cluster_util import arrive_and_hold, arrived, process_gone, quiet_config, running_cluster, until
from ipyparallel import error

from ipyparallel_broadcast.engine import compose

pytestmark = pytest.mark.cluster

N = 3


@pytest.fixture(scope="module")
def rc():
    with running_cluster(N, 1, 2, fork_engines=True) as client:
        yield client


def test_forked_engines_are_whole_engines(rc):
    view = rc.broadcast_view()
    pids = view.apply_sync(os.getpid)
    engines = [psutil.Process(p) for p in pids]
    (template,) = {e.ppid() for e in engines}  # one parent for all
    assert "ipyparallel_broadcast.engine.forked" in " ".join(psutil.Process(template).cmdline())
    for engine in engines:  # each has its nanny, forked from it
        (nanny,) = engine.children()
        assert nanny.pid != engine.pid
    assert sorted(s["rank"] for s in view.apply_sync(compose.status)) == list(range(N))
    assert {s["engines_on_host"] for s in view.apply_sync(compose.status)} == {N}
    draws = view.apply_sync(lambda: __import__("random").random())  # the engine's own stream
    assert len(set(draws)) == N  # no two engines share a random stream


def test_signals_reach_forked_engines_through_their_nannies(rc, tmp_path):
    view = rc.broadcast_view()
    ar = view.apply_async(arrive_and_hold, str(tmp_path))  # no "go": held until interrupted
    until(lambda: len(arrived(tmp_path)) == N, what="every engine to run the call")
    rc.send_signal(signal.SIGINT, targets=rc.ids, block=True)
    with pytest.raises(error.CompositeError) as info:
        ar.get(30)
    assert {e[0] for e in info.value.elist} == {"KeyboardInterrupt"}
    assert view.apply_sync(lambda: 1) == [1] * N  # and they serve on


def test_a_killed_forked_engine_fails_alone(tmp_path):
    """Killed with a call in flight: its siblings answer, it gives an EngineError."""
    with running_cluster(3, 1, 2, fork_engines=True) as rc:
        view = rc.broadcast_view()
        pids = view.apply_sync(os.getpid)
        ar = view.apply_async(arrive_and_hold, str(tmp_path))
        until(lambda: arrived(tmp_path) == sorted(pids), what="every engine to run the call")
        os.kill(pids[0], signal.SIGKILL)
        (tmp_path / "go").touch()
        results = ar.get(timeout=60, return_exceptions=True)
        assert isinstance(results[0], error.RemoteError) and results[0].ename == "EngineError"
        assert results[1:] == pids[1:]
        until(lambda: len(rc.ids) == 2, timeout=30, what="the hub to drop the killed engine")
        assert view.apply_sync(os.getpid) == pids[1:]


def test_the_launcher_setting_forks_and_stop_leaves_no_process():
    config = quiet_config()
    config.BroadcastEngineSetLauncher.fork = True
    with running_cluster(2, 1, 2, config=config) as rc:
        pids = rc.broadcast_view().apply_sync(os.getpid)
        family = [psutil.Process(pids[0]).ppid()] + pids + [k.pid for p in pids for k in psutil.Process(p).children()]
    until(
        lambda: all(process_gone(p) for p in family),
        timeout=30,
        what="the template, engines and nannies to exit",
    )
