"""A relay node process dies (SIGKILL) or hangs (SIGSTOP) with a request in
flight, on a real depth-2 cluster: the engines under it get an EngineError
naming the node (but for the root's: the client sends the call again), every
other engine's result arrives, no node keeps state, the controller restarts a
dead node in place, and later broadcasts work."""

import glob
import os
import re
import signal

import pytest
from cluster_util import at_gate, quiet_config, running_cluster, settled_stats, until
from ipyparallel import error
from traitlets.config import Config

pytestmark = pytest.mark.cluster

MODES = {"coalescing": True, "streaming": False}
UNDER = {"0.1": [1], "1": [2, 3], "root": [0, 1, 2, 3]}  # depth 2, fan-out 2, 4 engines
# the engines whose part fails: the root's death loses none, the client sends the call
# again and the engines answer from the replies they kept (issue 73)
FAILED = {"0.1": [1], "1": [2, 3], "root": []}
NODE_TIMEOUT = 5


@pytest.fixture(scope="module")
def rc():
    config = quiet_config()
    config.BroadcastController.node_timeout = NODE_TIMEOUT
    with running_cluster(4, 2, 2, config=config) as client:
        yield client


def nodes(rc):
    return {n["node"]: n for n in rc.broadcast_stats()}


def held_broadcast(rc, view, gate):
    """Start a broadcast the engines hold; return once every node has it."""
    ar = view.apply_async(at_gate, str(gate))
    until(lambda: all(n["pending"] == 1 for n in nodes(rc).values()))
    return ar


def check_outcomes(ar, lost, why):
    results = ar.get(timeout=120, return_exceptions=True)
    assert [eid for eid, r in zip(ar._targets, results) if isinstance(r, Exception)] == lost
    for eid, result in zip(ar._targets, results):
        if eid in lost:
            assert isinstance(result, error.RemoteError) and result.ename == "EngineError"
            assert why in str(result.evalue)
        else:
            assert isinstance(result, int)  # the engine's pid: its result arrived


def all_answer(view, n):
    """Wait until a broadcast on ``view`` has all ``n`` engines' results (a
    call the root lost as it restarted raises ConnectionError: tried again)."""

    def ok():
        try:
            return len(view.apply_sync(os.getpid)) == n
        except (error.CompositeError, ConnectionError):
            return False

    until(ok, what=f"{n} engine(s) to answer")


def serves_again(rc, view):
    """Later broadcasts reach every engine (engines reconnect to a restarted
    leaf by themselves, within zmq's reconnect interval)."""
    all_answer(view, 4)
    assert all(n["pending"] == 0 for n in settled_stats(rc))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("victim", ["0.1", "1", "root"])
def test_killed_node_fails_its_engines_and_is_restarted(rc, victim, mode, tmp_path):
    view = rc.broadcast_view(coalescing=MODES[mode])
    gate = tmp_path / "gate"
    ar = held_broadcast(rc, view, gate)
    before = nodes(rc)[victim]["pid"]
    os.kill(before, signal.SIGKILL)
    gate.touch()
    check_outcomes(ar, FAILED[victim], f"Relay node {victim} ")
    until(lambda: nodes(rc)[victim].get("pid") not in (None, before))  # restarted (down until then)
    serves_again(rc, view)


def test_a_node_restarted_once_its_restarted_parent_reached_it_fails_what_it_held(tmp_path):
    """The root restarts and knows no child's boot until each answers a ping;
    its first ping finds node 1 stopped, off the link, and is held until node
    1 is back (``relay.startup``), whose pong gives its boot. Node 1 then
    restarts, having taken a request: its new boot fails what it held, named."""
    config = quiet_config()
    config.BroadcastController.ping_interval = 60
    config.BroadcastController.node_timeout = 240
    with running_cluster(2, 1, 2, config=config) as rc:  # root, leaves 0 and 1, engine e under leaf e
        pids = {name: n["pid"] for name, n in nodes(rc).items()}
        os.kill(pids["1"], signal.SIGSTOP)
        try:
            os.kill(pids["root"], signal.SIGKILL)
            all_answer(rc.broadcast_view(targets=[0]), 1)  # the new root serves
        finally:
            os.kill(pids["1"], signal.SIGCONT)
        all_answer(rc.broadcast_view(targets=[1]), 1)  # node 1 is on the new root's link, unheard
        gate = tmp_path / "gate"
        ar = rc.broadcast_view().apply_async(at_gate, str(gate))
        until(lambda: all(n["pending"] == 1 for n in nodes(rc).values()))
        os.kill(pids["1"], signal.SIGKILL)
        gate.touch()
        check_outcomes(ar, [1], "Relay node 1 restarted; engine 1 ")
        until(lambda: nodes(rc)["1"].get("pid") not in (None, pids["1"]), what="node 1's restart")
        all_answer(rc.broadcast_view(), 2)
        assert all(n["pending"] == 0 for n in settled_stats(rc))


def test_hung_node_is_given_up_on_after_node_timeout(rc, tmp_path):
    view = rc.broadcast_view()
    pid = nodes(rc)["0.1"]["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        ar = view.apply_async(os.getpid)
        check_outcomes(ar, UNDER["0.1"], f"Relay node 0.1 has not answered for {NODE_TIMEOUT} s")
    finally:
        os.kill(pid, signal.SIGCONT)
    assert nodes(rc)["0.1"]["pid"] == pid  # alive all along: not restarted
    serves_again(rc, view)


def controller_log(rc):
    """The text of the controller's log (in the test profile's log folder)."""
    paths = glob.glob(os.path.join(rc.test_profile_dir, "log", "ipcontroller-*.log"))
    assert len(paths) == 1, paths
    with open(paths[0]) as f:
        return f.read()


def test_restarts_are_logged_and_bounded():
    config = Config()
    config.BroadcastController.node_restarts = 1
    with running_cluster(2, 1, 2, config=config) as rc:
        first = nodes(rc)["0"]["pid"]
        os.kill(first, signal.SIGKILL)
        until(lambda: nodes(rc)["0"].get("pid") not in (None, first), what="the first restart")
        second = nodes(rc)["0"]["pid"]
        os.kill(second, signal.SIGKILL)
        until(lambda: "giving up" in controller_log(rc), what="the controller to give up")
        restarts = re.findall(
            r"relay node 0 \(pid (\d+)\) exited with code -9; restarted as pid (\d+)", controller_log(rc)
        )
        assert restarts == [(str(first), str(second))]
        assert "relay node 0 exited (-9); restarted 1 times, giving up" in controller_log(rc)
        survey = nodes(rc)
        assert "error" in survey["0"]  # given up on: no process answers for it
        assert survey["1"]["pending"] == 0
        assert rc.broadcast_view(targets=[1]).apply_sync(lambda: 1) == [1]  # the rest serves


@pytest.mark.filterwarnings("ignore:Unregistering FD")  # sockets closed under their streams, as a GC does
def test_a_client_ended_in_any_order_never_stalls_its_zmq_context():
    """A client dropped without close() has its sockets closed by the garbage
    collector, in any order. If its root dies once some are closed, zmq's I/O
    thread must not stall: it serves every other socket of the context (the
    process-wide one, by default). With a socket monitor on the root's link it
    did stall (a monitor whose reader is closed blocks on its next event), and
    every later client of the process timed out reaching its hub."""
    import glob
    import json

    import zmq

    import ipyparallel_broadcast as ipb

    ctx = zmq.Context()
    try:
        with running_cluster(2, 0, 2) as rc:
            (path,) = glob.glob(os.path.join(rc.test_profile_dir, "security", "*-client.json"))
            with open(path) as f:
                dropped = ipb.Client(json.load(f), context=ctx)
            assert dropped.broadcast_view().apply_sync(lambda: 1) == [1, 1]
            for sock in list(ctx._sockets):
                if sock is not dropped._broadcast_socket:  # the root's link closes last
                    sock.close(linger=0)
            root = nodes(rc)["root"]["pid"]
            port = int(dropped._broadcast_socket.getsockopt(zmq.LAST_ENDPOINT).rsplit(b":", 1)[1])
            before = _links_to(port)
            assert before
            os.kill(root, signal.SIGKILL)  # the dropped client's link to the root closes
            until(lambda: not _links_to(port) & before, what="this process's links to the dead root closed")
        a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
        port = a.bind_to_random_port("tcp://127.0.0.1")
        b.connect(f"tcp://127.0.0.1:{port}")
        b.send(b"still serving")
        assert a.poll(5000), "the context's I/O thread is stalled"
        assert a.recv() == b"still serving"
        dropped._stop_io_thread()
    finally:
        ctx.destroy(linger=0)


def _links_to(port: int) -> set[int]:
    """The local ports of this process's TCP connections to ``port``."""
    import psutil

    return {c.laddr.port for c in psutil.Process().net_connections("tcp") if c.raddr and c.raddr.port == port}
