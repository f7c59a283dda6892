"""The controller as users start it: ipcluster, config, stock clients and
controllers, and failures."""

import glob
import os
import signal
import subprocess
import sys
import tempfile

import ipyparallel as ipp
import pytest
from cluster_util import arrive_and_hold, arrived, quiet_config, running_cluster, until
from ipyparallel import error

import ipyparallel_broadcast as ipb

pytestmark = pytest.mark.cluster


def ipcluster(*args, **kwargs):
    return subprocess.run(
        [sys.executable, "-m", "ipyparallel.cluster", *args],
        capture_output=True,
        text=True,
        timeout=120,
        **kwargs,
    )


def test_ipcluster_start_with_config_flags_and_file():
    """`ipcluster start --controller=broadcast` with CLI flags and a config file."""
    with tempfile.TemporaryDirectory() as profile_dir:
        with open(os.path.join(profile_dir, "ipcluster_config.py"), "w") as f:
            f.write("c.BroadcastController.fanout = 3\nc.HeartMonitor.period = 250\n")
        started = ipcluster(
            "start",
            "-n",
            "3",
            f"--profile-dir={profile_dir}",
            "--controller=broadcast",
            "--BroadcastController.depth=2",
            "--daemonize",
        )
        assert started.returncode == 0, started.stderr
        try:
            rc = ipb.Client(profile_dir=profile_dir)
            rc.wait_for_engines(3, timeout=60)
            layout = rc.broadcast_tree()
            assert (layout.depth, layout.fanout) == (2, 3)
            assert len(layout.leaves) == 9
            assert rc.broadcast_view().apply_sync(lambda: "hi") == ["hi"] * 3
            shown = subprocess.run(
                [sys.executable, "-m", "ipyparallel_broadcast.launch.tree", f"--profile-dir={profile_dir}"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert "depth=2 fanout=3" in shown.stdout and "engines [0]" in shown.stdout
            rc.close()
        finally:
            stopped = ipcluster("stop", f"--profile-dir={profile_dir}")
            assert stopped.returncode == 0, stopped.stderr


def test_bad_tree_config_is_refused():
    with tempfile.TemporaryDirectory() as profile_dir:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "ipyparallel_broadcast.controller",
                f"--profile-dir={profile_dir}",
                "--BroadcastController.fanout=1",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode != 0
        assert "fanout must be >= 2" in out.stderr


def test_the_clusters_depth_wins_over_the_same_setting_in_its_config():
    """``Cluster(depth=1)`` with ``BroadcastController.depth`` (and ``engines``)
    in the config: each reached the controller twice, which refused to start."""
    config = quiet_config()
    config.BroadcastController.depth = 2
    config.BroadcastController.engines = 100
    with running_cluster(2, 1, 2, config=config) as rc:
        assert (rc.tree_shape.depth, rc.tree_shape.fanout) == (1, 2)
        assert rc.broadcast_view().apply_sync(lambda: 3) == [3, 3]


def test_ipcluster_stops_with_the_error_of_a_controller_that_fails_to_start():
    """ipyparallel logged the error and waited forever, its cluster file left
    to block the next start; ipcluster now exits 1 with the controller's output."""
    with tempfile.TemporaryDirectory() as profile_dir:
        started = ipcluster(
            "start",
            "-n",
            "2",
            f"--profile-dir={profile_dir}",
            "--controller=broadcast",
            "--BroadcastController.depth=-1",
        )
        assert started.returncode == 1, started.stderr
        assert "depth must be >= 0, not -1" in started.stderr
        assert "The controller did not start" in started.stderr
        assert not [f for f in os.listdir(os.path.join(profile_dir, "security")) if f.startswith("cluster-")]


def test_our_view_on_a_stock_controller_fails_clearly():
    with tempfile.TemporaryDirectory() as profile_dir:
        cluster = ipp.Cluster(n=1, profile_dir=profile_dir, log_level=40, config=quiet_config())
        cluster.start_cluster_sync()
        try:
            rc = ipb.Client(profile_dir=profile_dir, cluster_id=cluster.cluster_id)
            rc.wait_for_engines(1, timeout=60)
            with pytest.raises(ipb.NotABroadcastController, match="--controller=broadcast"):
                rc.broadcast_view()
            assert rc[:].apply_sync(lambda: 1) == [1]  # everything else still works
            rc.close()
        finally:
            cluster.stop_cluster_sync()


@pytest.mark.parametrize("coalescing", [True, False, 2], ids=["coalescing", "streaming", "partial"])
def test_engine_killed_mid_request(coalescing, tmp_path):
    """Survivors' results arrive, the dead engine gives an EngineError, no hang."""
    with running_cluster(4, 1, 2) as rc:
        view = rc.broadcast_view(coalescing=coalescing)
        pids = view.apply_sync(os.getpid)
        ar = view.apply_async(arrive_and_hold, str(tmp_path))
        until(lambda: arrived(tmp_path) == sorted(pids), what="every engine to run the call")
        os.kill(pids[1], signal.SIGKILL)
        (tmp_path / "go").touch()
        results = ar.get(timeout=60, return_exceptions=True)
        assert [results[i] for i in (0, 2, 3)] == [pids[i] for i in (0, 2, 3)]
        assert isinstance(results[1], error.RemoteError) and results[1].ename == "EngineError"
        assert "Engine 1" in "".join(results[1].render_traceback())
        with pytest.raises(error.CompositeError) as info:
            ar.get()
        assert "EngineError" in str(info.value)  # renders (needs engine_info["method"])
        # later broadcasts skip nothing silently: the dead engine is gone from rc.ids
        until(lambda: len(rc.ids) == 3, timeout=30, what="the hub to drop the killed engine")
        assert rc.broadcast_view(coalescing=coalescing).apply_sync(lambda: 1) == [1, 1, 1]


@pytest.mark.parametrize("n, depth", [(3, "auto"), (4, 1)])
def test_auto_tree_is_sized_for_the_clusters_engines(n, depth):
    """depth/fanout 'auto': the controller learns the cluster's engine count
    and builds the shape topology.auto_shape picks for it on this host."""
    from ipyparallel_broadcast.engine.compose.host import cpu_count
    from ipyparallel_broadcast.wire.topology import auto_shape

    expected = auto_shape(n, cpu_count(), depth=None if depth == "auto" else depth)
    with running_cluster(n, depth, "auto") as rc:
        assert (rc.tree_shape.depth, rc.tree_shape.fanout) == (expected.depth, expected.fanout)
        assert rc._config["broadcast_tree"]["auto"] == dict(engines=n, cores=cpu_count())
        assert rc.broadcast_view().apply_sync(lambda: 5) == [5] * n
        assert len(rc.broadcast_stats()) == expected.n_nodes


def test_profile_ipcontroller_config_applies():
    """Settings in the profile's ipcontroller_config.py reach our controller."""
    with tempfile.TemporaryDirectory() as profile_dir:
        with open(os.path.join(profile_dir, "ipcontroller_config.py"), "w") as f:
            f.write("c.BroadcastController.depth = 0\nc.BroadcastController.fanout = 4\n")
        cluster = ipb.Cluster(n=1, profile_dir=profile_dir, log_level=40, config=quiet_config())
        rc = cluster.start_and_connect_sync()
        try:
            rc.wait_for_engines(1, timeout=60)
            assert (rc.tree_shape.depth, rc.tree_shape.fanout) == (0, 4)
            # a stock client's broadcast views work at depth 0, both modes
            stock = ipp.Client(profile_dir=profile_dir, cluster_id=cluster.cluster_id)
            for coalescing in (True, False):
                view = stock.broadcast_view(is_coalescing=coalescing)
                assert view.apply_sync(lambda: 7) == [7]
            stock.close()
            rc.close()
        finally:
            cluster.stop_cluster_sync()


def test_an_engine_stopped_by_its_launcher_exits_cleanly(tmp_path):
    """Launchers stop engines with SIGTERM (an engine ignores SIGINT);
    ipyparallel's engine then exits 1 with a traceback, and a cluster stopped
    in Jupyter logs every engine's output as a failure. Ours exits 0."""
    import glob

    cluster = ipb.Cluster(n=0, profile_dir=str(tmp_path), config=quiet_config(), log_level=40)
    cluster.start_controller_sync()
    rc = cluster.connect_client_sync()
    (engine_file,) = glob.glob(str(tmp_path / "security" / "*-engine.json"))
    engine = subprocess.Popen(
        [sys.executable, "-m", "ipyparallel_broadcast.engine", f"--file={engine_file}", "--log-level=40"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        rc.wait_for_engines(1, timeout=60)
        assert rc.broadcast_view().apply_sync(os.getpid) == [engine.pid]
        engine.send_signal(signal.SIGTERM)
        output = engine.communicate(timeout=60)[0]
        assert engine.returncode == 0, output[-2000:]
    finally:
        engine.kill()
        rc.close()
        cluster.stop_cluster_sync()


def test_the_controller_picks_its_ports_below_the_ephemeral_range():
    """A port picked at random and bound later must not be one an outgoing
    connection can take meanwhile (the kernel gives those from the ephemeral
    range): a heart monitor that lost its port left engines unregistered."""
    import json

    from ipyparallel_broadcast.controller.ports import LOWEST, ephemeral_range, quiet_port

    span = ephemeral_range()
    if span is None or span[0] - LOWEST < 1000:
        pytest.skip(f"no room below this host's ephemeral range {span}: IPython Parallel's pick is used")
    picked = [quiet_port() for _ in range(50)]
    assert len(set(picked)) == 50 and all(p is not None and p < span[0] for p in picked)
    with running_cluster(2, 1, 2) as rc:
        security = os.path.join(rc.test_profile_dir, "security")
        ports = []
        for name in os.listdir(security):
            with open(os.path.join(security, name)) as f:
                info = json.load(f)
            ports += [v for k, v in info.items() if k.endswith("_port") or k in ("registration", "mux", "task")]
            ports += [p for v in info.values() if isinstance(v, list) for p in v if isinstance(p, int)]
        ports = [p for p in ports if isinstance(p, int) and p > 0]
        assert ports and all(p < span[0] for p in ports), sorted(ports)


def test_the_engine_journal_follows_the_engines_and_ipcluster_restarts_a_killed_controller_with_them():
    """The journal a restarted controller reads (``controller.enginejournal``):
    every engine's id and uuid, and not an engine that left. Then the
    controller, SIGKILLed under ``ipcluster start``, is started again by it
    with ``--restore``: the same engines answer the same client, and
    ``ipcluster stop`` still stops everything."""
    import json

    from ipyparallel_broadcast.compat.ipp import engine_uuids
    from ipyparallel_broadcast.controller.enginejournal import read
    from ipyparallel_broadcast.launch.keepsettings import main_process

    with tempfile.TemporaryDirectory() as profile_dir:
        started = ipcluster("start", "-n", "4", f"--profile-dir={profile_dir}", "--controller=broadcast", "--daemonize")
        assert started.returncode == 0, started.stderr
        try:
            rc = ipb.Client(profile_dir=profile_dir)
            rc.wait_for_engines(4, timeout=60)
            path = os.path.join(profile_dir, "log", "engines.journal")

            def listed():
                return {eid: uuid for eid, (uuid, _) in read(path).engines.items()}

            engines = engine_uuids(rc)
            until(lambda: listed() == engines, what="every engine in the journal")
            gone = max(engines)
            rc[gone].shutdown(block=True)
            del engines[gone]
            until(lambda: listed() == engines, what="the stopped engine to leave the journal")
            until(lambda: rc.ids == sorted(engines), what="the stopped engine unregistered")

            (found,) = glob.glob(os.path.join(profile_dir, "security", "cluster-*.json"))
            with open(found) as f:
                keeper = json.load(f)["controller"]["state"]["pid"]  # (ipcluster itself has exited: daemonized)

            def controller_pid():
                hub = main_process(keeper)
                return None if hub is None else hub.pid

            pids = rc.broadcast_view().apply_sync(os.getpid)
            first = controller_pid()
            os.kill(first, signal.SIGKILL)
            until(lambda: controller_pid() not in (None, first), what="a new controller")

            def answers():
                try:
                    return rc.broadcast_view().apply_async(os.getpid).get(timeout=10) == pids
                except (error.CompositeError, error.RemoteError, TimeoutError):
                    return False

            until(answers, what="the same engines answering after the restart")
            assert rc.ids == sorted(engines) and listed() == engines
            rc.close()
        finally:
            stopped = ipcluster("stop", f"--profile-dir={profile_dir}")
            assert stopped.returncode == 0, stopped.stderr
