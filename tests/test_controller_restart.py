"""A controller that dies is restarted, and the cluster goes on (issue 59):
its launcher starts it again with ``--restore``; the engines, their ids and
their namespaces are kept; calls pending across it end once (a result or an
error naming the controller); the same client, and a new one, go on. An
engine that died meanwhile is found dead; a crash loop is given up on.
Real controllers, engines and sockets; the controller SIGKILLed."""

import contextlib
import glob
import json
import os
import signal
import sqlite3
import subprocess
import threading

import ipyparallel as ipp
import psutil
import pytest
import zmq
from cluster_util import StandInRelay, at_gate, process_gone, quiet_config, running_cluster, until
from ipyparallel import error

import ipyparallel_broadcast as ipb
from ipyparallel_broadcast.controller.restarts import keeper_file, read_keeper_file
from ipyparallel_broadcast.launch.keepsettings import RESTORE_ARGS, main_process
from ipyparallel_broadcast.relay.registrar import ENGINES
from ipyparallel_broadcast.wire import protocol as P

pytestmark = pytest.mark.cluster


def keeper(rc) -> psutil.Process:
    """The controller's keeper (``launch.keeper``): the process the launcher
    started, or the one that adopted the controller when that one died."""
    launched = rc.cluster.controller.process
    if launched.is_running():
        return launched
    found = read_keeper_file(keeper_file(rc.test_profile_dir, rc.cluster.cluster_id)).get("keeper")
    return psutil.Process(found) if found and psutil.pid_exists(found) else launched


def hub_pid(rc) -> int | None:
    """The controller's main process: its keeper's child (None between two)."""
    try:
        hub = main_process(keeper(rc).pid)
    except psutil.NoSuchProcess:
        return None
    return None if hub is None else hub.pid


def kill_controller(rc) -> int:
    pid = hub_pid(rc)
    os.kill(pid, signal.SIGKILL)
    return pid


def restarted_from(rc, pid: int) -> bool:
    return hub_pid(rc) not in (None, pid)


def broadcast_works(rc) -> bool:
    """A broadcast to every engine answers (False while the controller is away)."""
    try:
        return rc.broadcast_view().apply_sync(os.getpid) is not None
    except (error.CompositeError, error.RemoteError, TimeoutError):
        return False


def works(call) -> bool:
    try:
        return call()
    except (error.CompositeError, error.RemoteError, TimeoutError):
        return False


def ended_once(ar, n: int) -> list:
    """Each engine's part of a call pending across the kill: its result, or
    an EngineError naming the controller (or its root relay) that died."""
    results = ar.get(timeout=60, return_exceptions=True)
    results = results if isinstance(results, list) else [results]
    assert len(results) == n
    for r in results:
        if isinstance(r, error.RemoteError):
            assert r.ename == "EngineError", r
            assert "controller" in str(r.evalue) or "Relay node root" in str(r.evalue), r.evalue
    return results


def test_a_killed_controller_comes_back_with_its_engines_ids_namespaces_and_clients(tmp_path):
    with running_cluster(3, 1, 2) as rc:
        view = rc.broadcast_view()
        view.push(dict(kept="state"), block=True)
        ids, pids = list(rc.ids), rc[:].apply_sync(os.getpid)
        stock = ipp.Client(profile_dir=rc.test_profile_dir, cluster_id=rc.cluster.cluster_id)
        stock.wait_for_engines(len(ids), timeout=30)
        gate = tmp_path / "gate"
        pending = [view.apply_async(at_gate, str(gate)), rc[:].apply_async(at_gate, str(gate))]
        before = kill_controller(rc)
        until(lambda: restarted_from(rc, before), timeout=30, what="the controller restarted")
        open(gate, "w").close()
        for ar in pending:
            ended_once(ar, len(ids))
        until(lambda: broadcast_works(rc), timeout=60, what="a broadcast answered after the restart")
        assert rc.ids == ids
        assert view.pull("kept", block=True) == ["state"] * len(ids)
        assert rc[:].apply_sync(os.getpid) == pids  # the same processes
        try:  # a stock client goes on too, as IPython Parallel documents for --restore: its sockets reconnect
            until(lambda: works(lambda: stock[:].apply_sync(os.getpid) == pids), what="the stock client served")
            assert stock.ids == ids
        finally:
            stock.close()
        other = ipb.Client(profile_dir=rc.test_profile_dir, cluster_id=rc.cluster.cluster_id)
        try:
            assert other.ids == ids
            assert other.broadcast_view().pull("kept", block=True) == ["state"] * len(ids)
        finally:
            other.close()


def tally_and_hold(folder):
    """Engine side: count this run (a line in ``folder/runs-<pid>``), hold
    until ``folder/go`` exists; return the pid."""
    import os
    import time

    with open(os.path.join(folder, f"runs-{os.getpid()}"), "a") as f:
        f.write("ran\n")
    while not os.path.exists(os.path.join(folder, "go")):
        time.sleep(0.02)
    return os.getpid()


def runs(folder) -> dict:
    """How many times ``tally_and_hold`` ran in each engine: pid -> count."""
    return {
        int(name[5:]): len(open(os.path.join(folder, name)).readlines())
        for name in os.listdir(folder)
        if name.startswith("runs-")
    }


def test_broadcasts_pending_across_a_killed_controller_get_every_engines_value(tmp_path):
    """Issue 73: calls in flight when the controller is SIGKILLed end with the
    engines' values, not an error: the engines finish them and keep their
    replies, the client sends each call again once the controller is back, and
    each engine answers the copy from what it kept. Nothing runs twice."""
    with running_cluster(4, 1, 2) as rc:
        view, streamed = rc.broadcast_view(), rc.broadcast_view(coalescing=False)
        pids = view.apply_sync(os.getpid)
        pending = view.apply_async(tally_and_hold, str(tmp_path))
        until(lambda: len(runs(tmp_path)) == len(pids), what="every engine running the call")
        behind = [streamed.apply_async(os.getpid), view.reduce(lambda: 1, op="sum", block=False)]
        before = kill_controller(rc)
        until(lambda: restarted_from(rc, before), timeout=30, what="the controller restarted")
        open(tmp_path / "go", "w").close()
        assert pending.get(timeout=60) == pids
        assert behind[0].get(timeout=60) == pids
        assert behind[1].get(timeout=60) == len(pids)
        assert runs(tmp_path) == dict.fromkeys(pids, 1)  # once each
        assert view.apply_sync(os.getpid) == pids  # and the client goes on


@pytest.mark.parametrize("death", ["kernel", "host"])
def test_an_engine_that_dies_while_the_controller_is_away_is_found_dead(death):
    """``kernel``: its nanny tells the hub (queued until the hub is back);
    ``host``: the nanny dies with it, and its heart never beats again."""
    with running_cluster(3, 1, 2) as rc:
        pids = dict(zip(rc.ids, rc[:].apply_sync(os.getpid)))
        victim = rc.ids[-1]
        before = kill_controller(rc)
        engine = psutil.Process(pids[victim])
        for proc in (engine.children(recursive=True) if death == "host" else []) + [engine]:
            proc.kill()
        until(lambda: restarted_from(rc, before), timeout=30, what="the controller restarted")
        until(lambda: victim not in rc.ids, timeout=60, what="the dead engine unregistered")
        survivors = [eid for eid in pids if eid != victim]
        until(lambda: broadcast_works(rc), timeout=60, what="a broadcast answered after the restart")
        assert rc.ids == survivors
        assert rc.broadcast_view().apply_sync(os.getpid) == [pids[eid] for eid in survivors]


def test_a_controller_that_keeps_dying_is_given_up_and_its_cluster_stops():
    config = quiet_config()
    config.BroadcastControllerLauncher.controller_restarts = 1
    with running_cluster(2, 1, 2, config=config) as rc:
        first = kill_controller(rc)
        until(lambda: restarted_from(rc, first), timeout=30, what="the controller restarted once")
        second = kill_controller(rc)
        until(lambda: process_gone(keeper(rc).pid), what="the keeper giving up")
        assert process_gone(second)
        with open(rc.cluster.controller.output_file) as f:
            assert "restarted 1 times in 60 s: giving up" in f.read()


def test_a_killed_keeper_is_replaced_by_one_that_adopts_the_running_controller():
    """Issue 73: the keeper SIGKILLed does not end the cluster. The controller
    goes on, serving, and starts a keeper that adopts it, named in its log and
    in ``rc.broadcast_tree()``; the launcher follows that keeper. A later kill
    of the controller is restarted by it, engines and namespaces kept; the
    cluster's stop stops it all, and only that orderly stop removes the journal."""
    with running_cluster(2, 1, 2) as rc:
        view = rc.broadcast_view()
        view.push(dict(kept="state"), block=True)
        ids, first, hub = list(rc.ids), keeper(rc), hub_pid(rc)
        (journal,) = glob.glob(os.path.join(rc.test_profile_dir, "log", "engines*.journal"))
        first.kill()
        until(lambda: keeper(rc).pid != first.pid, what="a new keeper")
        second = keeper(rc)
        assert hub_pid(rc) == hub  # the same controller, adopted
        assert view.apply_sync(os.getpid) is not None
        until(lambda: f"kept by pid {second.pid}" in repr(rc.broadcast_tree()), what="the tree naming the keeper")
        with open(rc.cluster.controller.output_file) as f:
            assert f"The controller's keeper (pid {first.pid}) died: keeper pid {second.pid} adopts it" in f.read()
        kill_controller(rc)
        until(lambda: restarted_from(rc, hub), timeout=30, what="the adopting keeper restarting the controller")
        until(lambda: broadcast_works(rc), timeout=60, what="a broadcast answered after the restart")
        assert rc.ids == ids
        assert view.pull("kept", block=True) == ["state"] * len(ids)
        assert os.path.exists(journal)
        last = hub_pid(rc)
    assert not os.path.exists(journal)  # the cluster's stop: orderly
    assert process_gone(second.pid) and process_gone(last)


def _committed(db: str, msg_ids: list) -> bool:
    """Whether SQLite's file holds every one of ``msg_ids``, completed."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
            marks = ",".join("?" * len(msg_ids))
            query = f"SELECT COUNT(*) FROM 'ipython-tasks' WHERE completed IS NOT NULL AND msg_id IN ({marks})"
            return con.execute(query, msg_ids).fetchone()[0] == len(msg_ids)
    except sqlite3.Error:  # not made yet, or being written
        return False


def test_task_records_in_sqlite_outlive_a_killed_controller():
    """Issue 73: with ``SQLiteDB`` the records filed before the controller died
    (a DirectView call's, a broadcast's per engine) are found by a client of the
    restored one. IPython Parallel's table check took its own table for an old
    format, and the restored hub started an empty one (``controller.sqlstore``)."""
    config = quiet_config()
    config.BroadcastController.db_class = "SQLiteDB"
    with running_cluster(2, 1, 2, config=config) as rc:
        ars = [rc[:].apply_async(os.getpid), rc.broadcast_view().apply_async(os.getpid)]
        for ar in ars:
            ar.get(timeout=30)
        ids = [m for ar in ars for m in ar.msg_ids]
        db = os.path.join(rc.test_profile_dir, "tasks.db")
        until(lambda: _committed(db, ids), timeout=30, what="the records committed to SQLite")
        before = kill_controller(rc)
        until(lambda: restarted_from(rc, before), timeout=30, what="the controller restarted")
        until(lambda: broadcast_works(rc), timeout=60, what="a broadcast answered after the restart")
        other = ipb.Client(profile_dir=rc.test_profile_dir, cluster_id=rc.cluster.cluster_id)
        try:
            found = other.db_query({"msg_id": {"$in": ids}}, keys=["msg_id", "completed"])
            assert sorted(r["msg_id"] for r in found) == sorted(ids)
            assert all(r["completed"] for r in found)
        finally:
            other.close()


def test_an_engine_granted_its_id_before_the_controller_died_is_registered_when_it_beats_after():
    """The chaos soak found it: an engine granted its id whose heart had not
    yet beaten when the controller died was left unregistered for good (the
    restored hub knew no such engine). Grants are journaled too; the test
    speaks for a host relay, with the relay's own ``Registrar``."""
    with StandInRelay("a-host") as standin:
        cluster, rc = standin.cluster, standin.rc
        uuid = "engine-granted-then-orphaned"
        eid = standin.ask(uuid)
        before = main_process(cluster.controller.process.pid).pid
        os.kill(before, signal.SIGKILL)
        until(lambda: getattr(main_process(cluster.controller.process.pid), "pid", before) != before)
        standin.batch(standin.relay.beating([uuid]))
        rc.wait_for_engines(1, timeout=30)
        assert rc.ids == [eid]


def test_a_client_whose_connection_request_died_with_the_controller_asks_the_restarted_one():
    """The chaos soak found it: clients started as the controller was killed
    never ran (IPython Parallel's client asks once, and waits until its
    timeout). Here the request reaches a socket in the hub's place that
    never answers (a controller that took it with it), then the controller
    comes back: our client asks it again once it hears it beat."""
    config = quiet_config()
    config.BroadcastControllerLauncher.controller_restarts = 0  # restarted by hand below
    with running_cluster(1, 1, 2, config=config) as rc:
        cluster = rc.cluster
        hub = main_process(cluster.controller.process.pid)
        argv, env = hub.cmdline(), hub.environ()  # (the launcher names the profile in the environment)
        with open(glob.glob(os.path.join(rc.test_profile_dir, "security", "*-client.json"))[0]) as f:
            info = json.load(f)
        children = hub.children()
        hub.kill()
        until(lambda: all(process_gone(p.pid) for p in [hub, *children]), what="the controller and its children gone")
        black_hole = zmq.Context.instance().socket(zmq.ROUTER)
        black_hole.linger = 0
        until(lambda: _bound(black_hole, f"{info['interface']}:{info['registration']}"), what="its port free")
        made = {}
        connecting = threading.Thread(
            target=lambda: made.update(rc=_client_or_error(rc.test_profile_dir, cluster.cluster_id)), daemon=True
        )
        connecting.start()
        assert black_hole.poll(30_000), "the client's connection request did not come"
        black_hole.recv_multipart()  # taken, never answered: as by a controller that died with it
        black_hole.close()
        restarted = subprocess.Popen(
            [*argv, *RESTORE_ARGS], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            connecting.join(60)
            assert isinstance(made.get("rc"), ipb.Client), made
            try:
                assert made["rc"].ids == rc.ids
            finally:
                made["rc"].close()
        finally:
            restarted.terminate()
            restarted.wait(30)


def _bound(sock, url) -> bool:
    try:
        sock.bind(url)
        return True
    except zmq.ZMQError:
        return False


def _client_or_error(profile_dir, cluster_id):
    try:
        return ipb.Client(profile_dir=profile_dir, cluster_id=cluster_id, timeout=45)
    except Exception as e:
        return e


def test_an_engine_dropped_but_not_yet_told_when_the_controller_died_is_told_by_the_restarted_one():
    """The chaos runs found it: the hub drops the engines of a host whose relay
    fell silent, and tells each it was dropped once the relay is heard again;
    if the controller dies first, the engine lived on, unregistered, for good.
    Drops are journaled; a relay whose link to the hub connects again says
    hello; the restarted hub then tells the engine, through that relay."""
    with StandInRelay("a-silent-host", config=quiet_config()) as standin:
        cluster, rc = standin.cluster, standin.rc
        uuid = "engine-dropped-then-orphaned"
        heart = standin.beat()
        standin.ask(uuid)
        standin.batch(standin.relay.beating([uuid]))
        rc.wait_for_engines(1, timeout=30)
        # the monitor counts a heart at the ping after its first answer (then, its silence is a failure)
        until(lambda: heart.answered >= 3, what="the relay's heart counted")
        heart.stop()  # the host falls silent: the hub drops its engine, and cannot tell it yet
        until(lambda: rc.ids == [], what="the silent host's engine dropped")
        before = main_process(cluster.controller.process.pid).pid
        os.kill(before, signal.SIGKILL)
        until(lambda: getattr(main_process(cluster.controller.process.pid), "pid", before) != before)
        sends = standin.batch(standin.relay.hello())  # (a relay says it when its link to the hub connects again)
        told = [s for s in sends if s.socket == ENGINES and s.frames[0] == uuid.encode()]
        while not told:
            told = [s for s in standin.heard() if s.socket == ENGINES and s.frames[0] == uuid.encode()]
        assert standin.codec.unpack(P.split_idents(told[0].frames)[1])["header"]["msg_type"] == P.DROPPED


def count_and_return(folder, n):
    """Engine side: note call ``n`` ran here (a line in ``folder/<pid>``); give ``n`` back."""
    import os

    with open(os.path.join(folder, str(os.getpid())), "a") as f:
        f.write(f"{n}\n")
    return n


def test_a_client_calling_in_a_loop_across_controller_kills_gets_every_call_right_and_none_runs_twice(tmp_path):
    """Issue 73's kill loop: the controller SIGKILLed twice while a client
    calls a broadcast in a loop. Every call ends with every engine's value:
    none fails, none hangs, and no engine runs a call twice."""
    with running_cluster(2, 1, 2) as rc:
        view, outcomes, stop = rc.broadcast_view(), [], threading.Event()

        def calling():
            n = 0
            while not stop.is_set():
                n += 1
                try:
                    outcomes.append(view.apply_async(count_and_return, str(tmp_path), n).get(timeout=60) == [n, n])
                except Exception as e:  # (any failure is one: counted, and shown below)
                    outcomes.append(repr(e))

        caller = threading.Thread(target=calling, daemon=True)
        caller.start()
        for _ in range(2):
            mark = len(outcomes)
            until(lambda: len(outcomes) >= mark + 20, what="calls answered before the kill")  # noqa: B023
            before = kill_controller(rc)
            until(lambda: restarted_from(rc, before), timeout=30, what="the controller restarted")  # noqa: B023
        mark = len(outcomes)
        until(lambda: len(outcomes) >= mark + 20, what="calls answered after the restarts")
        stop.set()
        caller.join(90)
    assert not caller.is_alive()
    assert [o for o in outcomes if o is not True] == []
    for name in os.listdir(tmp_path):
        with open(tmp_path / name) as f:
            runs = f.read().split()
        assert len(runs) == len(set(runs)), name  # no call twice on an engine
