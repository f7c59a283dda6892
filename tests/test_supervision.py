"""Every process of the controller is supervised (issue 47): a queue process
killed with a call pending on it fails that call at once, per engine, naming
the queue; it is restarted in place and later calls of that kind work; a
restarted heart monitor still finds dead engines; and when the controller
itself dies, its children go with it and clients' calls fail, naming it.
Real controllers, engines and sockets; processes found by their names."""

import contextlib
import glob
import os
import signal
import subprocess
import sys
import threading

import psutil
import pytest
from cluster_util import at_gate, process_gone, quiet_config, running_cluster, until
from ipyparallel import error
from traitlets.config import Config

import ipyparallel_broadcast as ipb
from ipyparallel_broadcast.launch.keepsettings import main_process

pytestmark = pytest.mark.cluster


def controller_pid(rc) -> int:
    return main_process(rc.cluster.controller.process.pid).pid


def child(rc, comm: str) -> int:
    """The pid of the controller's child process named ``comm`` (``ipb-mux``...)."""
    pids = []
    for p in psutil.Process(controller_pid(rc)).children():
        try:
            if p.name() == comm:
                pids.append(p.pid)
        except psutil.NoSuchProcess:  # reaped between the listing and the look (one just killed)
            continue
    (pid,) = pids
    return pid


def restarted(rc, comm: str, before: int) -> bool:
    try:
        return child(rc, comm) != before
    except ValueError:  # none (it is down) or two (the old one not reaped yet)
        return False


def held(view, gate):
    return view.apply_async(at_gate, str(gate))


def on_engines(rc) -> bool:
    """Whether the hub saw a request reach an engine (through the mux or the task queue)."""
    status = rc.queue_status()
    return any(status[eid]["queue"] + status[eid]["tasks"] for eid in rc.ids)


def failed_naming(ar, what: str, n: int):
    with pytest.raises((error.CompositeError, error.RemoteError)):
        ar.get(timeout=60)
    results = ar.get(return_exceptions=True) if n > 1 else [ar.get(return_exceptions=True)]
    assert len(results) == n
    for result in results:
        assert isinstance(result, error.RemoteError) and result.ename == "EngineError", result
        assert what in str(result.evalue)


@pytest.fixture(scope="module")
def rc():
    with running_cluster(3, 1, 2) as client:
        yield client


def test_every_child_of_the_controller_is_named(rc):
    names = sorted(p.name() for p in psutil.Process(controller_pid(rc)).children())
    expected = ["ipb-control", "ipb-heart", "ipb-iopub", "ipb-mux", "ipb-node-0", "ipb-node-1", "ipb-node-root"]
    assert names == sorted(expected + ["ipb-task"])


def test_the_controller_watch_of_a_closing_client_stops_quietly(rc):
    """The watch runs on the client's I/O thread each second; a client closing
    closes its notices stream there first, and a watch that ran between the
    two raised on the closed socket ('controller watch failed', logged)."""
    (path,) = glob.glob(os.path.join(rc.test_profile_dir, "security", "*-client.json"))
    client = ipb.Client(path)
    client._loop.add_callback(client._watch.notices.close)
    closed = threading.Event()
    client._loop.add_callback(lambda: closed.set() if client._watch.notices.closed() else None)
    assert closed.wait(10)
    errors = []
    done = threading.Event()

    def watch():
        try:
            client._watch.check()
        except Exception as e:  # what the guarded callback would log
            errors.append(e)
        done.set()

    client._loop.add_callback(watch)
    assert done.wait(10) and errors == []
    client.close()


VIEWS = {  # the queue a call goes through, and the call (held on the engines until the gate opens)
    "DirectView apply": ("mux", lambda rc, gate: rc[:].apply_async(at_gate, gate)),
    "BroadcastView(path='direct') map": (
        "mux",
        lambda rc, gate: rc.broadcast_view(path="direct").map_async(at_gate, [gate] * len(rc.ids)),
    ),
    "LoadBalancedView apply": ("task", lambda rc, gate: rc.load_balanced_view().apply_async(at_gate, gate)),
}


@pytest.mark.parametrize("kind", VIEWS)
def test_a_killed_queue_fails_what_it_held_and_serves_again(rc, kind, tmp_path):
    queue, call = VIEWS[kind]
    gate = tmp_path / "gate"
    ar = call(rc, str(gate))
    until(lambda: on_engines(rc), what="the request on the engines")
    before = child(rc, f"ipb-{queue}")
    os.kill(before, signal.SIGKILL)
    failed_naming(ar, f"the controller's {queue} queue died (pid {before})", len(rc.ids) if queue == "mux" else 1)
    gate.touch()
    until(lambda: restarted(rc, f"ipb-{queue}", before), what=f"a new {queue} queue")
    if queue == "mux":
        assert len(set(rc[:].apply_sync(os.getpid))) == len(rc.ids)
        assert rc.broadcast_view(path="direct").map_sync(abs, range(-6, 0)) == [6, 5, 4, 3, 2, 1]
    else:
        assert rc.load_balanced_view().map_sync(abs, range(-12, 0)) == list(range(12, 0, -1))
    rc.wait(timeout=60)  # the held calls' engines are free again


def test_a_killed_control_queue_is_restarted_and_control_requests_work(rc):
    before = child(rc, "ipb-control")
    os.kill(before, signal.SIGKILL)
    until(lambda: restarted(rc, "ipb-control", before), what="a new control queue")
    until(lambda: clear_works(rc), what="rc.clear() after the control queue's restart")


def clear_works(rc) -> bool:
    try:
        rc.clear(block=True)
    except error.RemoteError as e:  # sent before the death was known: failed, naming it
        assert "the controller's control queue died" in str(e.evalue)
        return False
    return True


def test_a_killed_iopub_relay_is_restarted_and_outputs_flow_again(rc):
    before = child(rc, "ipb-iopub")
    os.kill(before, signal.SIGKILL)
    until(lambda: restarted(rc, "ipb-iopub", before), what="a new IOPub relay")

    def printed() -> bool:
        ar = rc[:].execute("print('back')", block=False)
        ar.get(timeout=60)
        ar.wait_for_output(60)
        return ar.stdout == ["back\n"] * len(rc.ids)

    until(printed, what="outputs after the IOPub relay's restart")


def test_a_restarted_heart_monitor_still_finds_a_silent_engine():
    """A paused engine (SIGSTOP) is found by its heart alone: its process and
    sockets live. The new monitor knows the hub's hearts, so a heart that never
    beats for it is a failure, not a stranger."""
    with running_cluster(3, 1, 2, config=quiet_config()) as rc:
        before = child(rc, "ipb-heart")
        os.kill(before, signal.SIGKILL)
        until(lambda: restarted(rc, "ipb-heart", before), what="a new heart monitor")
        victim = rc[rc.ids[-1]].apply_sync(os.getpid)
        os.kill(victim, signal.SIGSTOP)
        try:
            until(lambda: len(rc.ids) == 2, what="the silent engine unregistered")
        finally:
            os.kill(victim, signal.SIGCONT)  # it is told it was dropped, and exits


def controller_dies(gate: str):
    """In a process of its own (below): calls pending when the controller is
    SIGKILLed, and left dead (restarts: ``test_controller_restart.py``)."""
    config = quiet_config()
    config.BroadcastControllerLauncher.controller_restarts = 0
    with running_cluster(3, 1, 2, config=config) as rc:
        rc.controller_timeout = 3.0
        children = [p.pid for p in psutil.Process(controller_pid(rc)).children()]
        direct = held(rc[:], gate)
        tree = held(rc.broadcast_view(), gate)
        until(lambda: on_engines(rc), what="the request on the engines")
        os.kill(controller_pid(rc), signal.SIGKILL)
        for ar in (direct, tree):
            failed_naming(ar, "the controller sent no sign of life for 3 s", len(rc.ids))
        until(lambda: all(process_gone(pid) for pid in children), what="the controller's children gone")
        open(gate, "w").close()
        rc.close(linger=0)


def test_when_the_controller_dies_its_children_go_and_calls_fail_naming_it(tmp_path):
    """Run in a process of its own: a client's sockets closed with messages for the
    dead controller still queued keep its process-wide zmq context's ``term()``
    waiting, and with it every later test that destroys that context."""
    here = os.path.dirname(os.path.abspath(__file__))
    code = f"import sys; sys.path.insert(0, {here!r}); import test_supervision as t; t.controller_dies(sys.argv[1])"
    run = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "gate")], capture_output=True, text=True, timeout=240
    )
    assert run.returncode == 0, run.stderr[-3000:]


def test_an_engine_that_dies_while_a_restarted_task_queue_waits_is_not_scheduled():
    """A restarted task scheduler waits (up to 2 s) for the hub's engines to
    reconnect. One paused then does not; killed meanwhile, it must be dropped
    from the wait, not scheduled when the wait ends: tasks sent to it would be
    lost, and wait forever. (Default heartbeats: the hub still lists it when
    the new scheduler asks.)"""
    with running_cluster(3, 1, 2, config=Config()) as rc:
        pids = dict(zip(rc.ids, rc[:].apply_sync(os.getpid)))
        victim = pids[rc.ids[-1]]
        os.kill(victim, signal.SIGSTOP)
        before = child(rc, "ipb-task")
        os.kill(before, signal.SIGKILL)
        until(lambda: restarted(rc, "ipb-task", before), what="a new task queue")
        os.kill(victim, signal.SIGKILL)
        until(lambda: len(rc.ids) == 2, what="the dead engine unregistered")
        ar = rc.load_balanced_view().map_async(abs, range(-24, 0), chunksize=1)
        assert ar.get(timeout=30) == list(range(24, 0, -1))


def test_a_task_for_an_engine_not_reconnected_to_a_restarted_task_queue_waits_for_it():
    """The chaos runs found it: a restarted task scheduler schedules on every
    engine once its wait ends, reconnected or not; a task sent to one not yet
    reconnected (here paused, its heart forgiven) was dropped by the ROUTER
    and waited forever. It waits for the engine now, and runs."""
    args = ["--HeartMonitor.max_heartmonitor_misses=1000", "--RestartableTaskScheduler.hold=0.1"]
    with running_cluster(2, 1, 2, controller_args=args) as rc:
        pids = dict(zip(rc.ids, rc[:].apply_sync(os.getpid)))
        victim = rc.ids[-1]
        os.kill(pids[victim], signal.SIGSTOP)
        try:
            before = child(rc, "ipb-task")
            os.kill(before, signal.SIGKILL)
            until(lambda: restarted(rc, "ipb-task", before), what="a new task queue")
            view = rc.load_balanced_view(targets=[victim])
            ar = view.apply_async(os.getpid)

            def handed():
                nonlocal ar
                if ar.ready():  # sent before the client heard the old queue died: failed naming it, as promised
                    with pytest.raises(error.RemoteError, match="task queue died"):
                        ar.get(0)
                    ar = view.apply_async(os.getpid)
                    return False
                return rc.queue_status()[victim]["tasks"] == 1

            until(handed, what="the task handed to the paused engine")
        finally:
            os.kill(pids[victim], signal.SIGCONT)
        assert ar.get(timeout=60) == pids[victim]


def test_a_request_replayed_through_a_second_queue_is_answered_and_does_not_hold_its_engine():
    """The chaos soak's replay: one signed request sent to the mux and to the
    task queue. The engine runs the first copy; ipykernel dropped the second
    unanswered, and the task queue held that engine's one slot (its
    high-water mark) for good: every later task for it waited forever. The
    engine answers the copy with an error naming the replay now."""
    import json

    import zmq
    from ipyparallel.serialize import pack_apply_message
    from jupyter_client.session import Session

    with running_cluster(2, 1, 2) as rc:
        victim = rc.ids[0]
        uuid = rc._engine_table[victim]
        (path,) = glob.glob(os.path.join(rc.test_profile_dir, "security", "*-client.json"))
        with open(path) as f:
            info = json.load(f)
        session = Session(key=info["key"].encode(), signature_scheme=info["signature_scheme"])
        msg = session.msg("apply_request", content={}, metadata={"targets": [uuid]})
        frames = session.serialize(msg) + pack_apply_message(os.getpid, (), {})
        answers = {}
        for queue, idents in (("mux", [uuid.encode()]), ("task", [])):  # the same frames, one queue after the other
            sock = zmq.Context.instance().socket(zmq.DEALER)
            sock.linger = 0
            try:
                sock.connect(f"{info['interface']}:{info[queue]}")
                sock.send_multipart(idents + frames)
                assert sock.poll(30_000), f"no answer through the {queue} queue"
                _, reply = session.feed_identities(sock.recv_multipart())
                answers[queue] = session.deserialize(reply)["content"]
            finally:
                sock.close()
        assert answers["mux"]["status"] == "ok"
        assert answers["task"]["status"] == "error" and "replay" in answers["task"]["evalue"]
        assert rc.load_balanced_view(targets=[victim]).apply_async(os.getpid).get(timeout=60) > 0


@contextlib.contextmanager
def every_engine_busy(tmp_path):
    """Three engines, each running a task that waits at a gate; yields ``(rc,
    the last engine's id, its pid, its task)``. Then no other task may have
    ended, and the others end once the gate opens."""
    with running_cluster(3, 1, 2) as rc:
        victim = rc.ids[-1]
        pid = rc[victim].apply_sync(os.getpid)
        gate = tmp_path / "gate"
        busy = [rc.load_balanced_view(targets=[eid]).apply_async(at_gate, str(gate)) for eid in rc.ids]
        until(lambda: all(rc.queue_status()[eid]["tasks"] for eid in rc.ids), what="every engine busy")
        yield rc, victim, pid, busy[-1]
        assert not any(ar.ready() for ar in busy[:-1])  # no other task had ended
        gate.touch()
        assert len(set(ar.get(timeout=60) for ar in busy[:-1])) == 2


def failed_as_impossible(queued):
    with pytest.raises(error.RemoteError) as e:
        queued.get(timeout=30)  # before the others' gate opens
    assert e.value.ename == "ImpossibleDependency"


def test_a_queued_task_whose_only_engine_dies_fails_though_no_other_task_ends(tmp_path):
    """A task for one engine, queued while that engine is busy, fails once the
    engine is gone, even while every other engine is busy too: IPython
    Parallel's scheduler checks queued tasks again only when some task ends
    (the chaos soak found such a LoadBalancedView map waiting for good)."""
    with every_engine_busy(tmp_path) as (rc, victim, pid, _):
        queued = rc.load_balanced_view(targets=[victim]).apply_async(os.getpid)
        os.kill(pid, signal.SIGKILL)
        failed_as_impossible(queued)


def test_a_task_read_after_its_only_engine_was_dropped_fails_while_every_engine_is_busy(tmp_path):
    """The same, the other way round: the task queue drops the engine before it
    reads the task (a relay that finds the process gone at once tells the hub
    before the client's send lands; CI found the task waiting). ipyparallel's
    ``maybe_run`` asks whether a task's engines are left only when some engine
    has room. The task comes from a second client whose I/O thread (which
    sends, and reads the notices) is held until the queue has dropped the
    engine: the hub has the running task's failure, which the queue reports
    5 s after it dropped its engine."""
    with every_engine_busy(tmp_path) as (rc, victim, pid, running):
        (path,) = glob.glob(os.path.join(rc.test_profile_dir, "security", "*-client.json"))
        other = ipb.Client(path)
        try:
            hold = threading.Event()
            other._io_loop.add_callback(hold.wait)  # its sends wait (ipyparallel sends on that thread)
            try:
                queued = other.load_balanced_view(targets=[victim]).apply_async(os.getpid)
                os.kill(pid, signal.SIGKILL)
                until(lambda: rc.result_status(running.msg_ids)["completed"], what="the running task failed")
            finally:
                hold.set()
            failed_as_impossible(queued)
        finally:
            other.close()
