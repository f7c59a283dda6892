"""Supervision without a cluster: a real RouterQueue over real sockets holds a
request for an engine not connected yet; the supervisor restarts real
processes within its budget; a child is named and dies with its parent."""

import os
import signal

import psutil
import pytest
import zmq
from cluster_util import process_gone, until

from ipyparallel_broadcast.controller.queues import RouterQueue
from ipyparallel_broadcast.controller.supervise import Supervisor, child_process

pytestmark = pytest.mark.cluster


def test_a_request_for_an_engine_not_connected_yet_reaches_it_when_it_connects():
    ctx = zmq.Context()
    spec = dict(
        in_url="tcp://127.0.0.1:*",
        out_url="tcp://127.0.0.1:*",
        in_identity=b"mux_in",
        out_identity=b"mux_out",
        in_prefix=b"in",
        out_prefix=b"out",
    )
    queue = RouterQueue(ctx, spec)
    try:
        in_url, out_url = queue.ins.LAST_ENDPOINT.decode(), queue.outs.LAST_ENDPOINT.decode()
        client = ctx.socket(zmq.DEALER)
        client.connect(in_url)
        client.send_multipart([b"engine-1", b"request", b"0"])
        client.send_multipart([b"engine-1", b"request", b"1"])
        until(lambda: queue.once(50) or queue.held, what="the requests held")
        assert queue.held.blocks(b"engine-1")
        engine = ctx.socket(zmq.ROUTER)
        engine.IDENTITY = b"engine-1"
        engine.connect(out_url)
        got = []

        def take():
            queue.once(50)
            if engine.poll(0):
                got.append(engine.recv_multipart()[2:])  # (after the queue's identity and the client's)
            return len(got) == 2

        until(take, what="the held requests delivered")
        assert got == [[b"request", b"0"], [b"request", b"1"]] and not queue.held
    finally:
        ctx.destroy(linger=0)


def _exit_with(code):
    os._exit(code)


def _wait_forever():
    signal.pause()


def test_the_supervisor_restarts_a_dead_child_and_gives_up_on_a_crash_loop():
    supervisor = Supervisor(limit=2, window=60.0)
    looping = supervisor.add("loop", lambda: child_process(_exit_with, "loop", "ipb-test-loop", dict(code=3)))
    steady = supervisor.add("steady", lambda: child_process(_wait_forever, "steady", "ipb-test-steady", {}))
    for child in (looping, steady):
        child.process.start()
    try:
        exits = []
        until(lambda: exits.extend(supervisor.check()) or looping.given_up, what="the crash loop given up on")
        assert [(e.child.name, e.old.exitcode, e.new is None) for e in exits] == [
            ("loop", 3, False),
            ("loop", 3, False),
            ("loop", 3, True),
        ]
        assert looping.restarts == 2 and steady.restarts == 0
        first = steady.process
        os.kill(first.pid, signal.SIGKILL)
        until(lambda: supervisor.check() or steady.process is not first, what="the killed child restarted")
        assert steady.restarts == 1 and steady.process.is_alive()
        supervisor.stop()
        os.kill(steady.process.pid, signal.SIGKILL)
        steady.process.join()
        assert supervisor.check() == []  # not once stopping
    finally:
        for process in supervisor.processes():
            if process.is_alive():
                process.kill()
            process.join()


def test_a_child_is_named_and_ends_with_its_parent(tmp_path):
    parent = child_process(_parent_of_one, "parent", "ipb-test-parent", dict(out=str(tmp_path / "pid")))
    parent.daemon = False  # (a daemon may not have children)
    parent.start()
    until(lambda: (tmp_path / "pid").exists() and (tmp_path / "pid").read_text().strip(), what="the grandchild")
    grandchild = int((tmp_path / "pid").read_text())
    # the child names itself once it runs, which may be after its parent wrote its pid
    until(lambda: psutil.Process(grandchild).name() == "ipb-test-grand", what="the grandchild to name itself")
    os.kill(parent.pid, signal.SIGKILL)
    parent.join()

    until(lambda: process_gone(grandchild), what="the grandchild ended by its parent's death")


def _parent_of_one(out):
    grandchild = child_process(_wait_forever, "grand", "ipb-test-grand", {})
    grandchild.daemon = False
    grandchild.start()
    with open(out + ".new", "w") as f:
        f.write(str(grandchild.pid))
    os.replace(out + ".new", out)
    signal.pause()
