"""The client's I/O thread: our state exists before any socket can deliver,
and a handler that raises never stops its stream (issue 15).

pyzmq's ZMQStream re-raises a callback's exception and then reads no more
from that socket; before the fix, one such exception (an IOPub message that
arrived while ``Client.__init__`` still ran) left every later ``execute``
waiting for output forever.
"""

import glob
import os
import threading
import time

import pytest
from cluster_util import running_cluster

import ipyparallel_broadcast as ipb
from ipyparallel_broadcast.wire import protocol as P
from ipyparallel_broadcast.wire.naming import is_broadcast_id

pytestmark = pytest.mark.cluster

WAIT = 30  # seconds: generous bounds on events, never a sleep


@pytest.fixture(scope="module")
def rc():
    with running_cluster(2, 1, 2) as client:
        yield client


def connection_file(rc):
    (path,) = glob.glob(os.path.join(rc.test_profile_dir, "security", "*-client.json"))
    return path


class DeliveredDuringInit(ipb.Client):
    """A client whose constructor returns only after its I/O thread has handled
    an IOPub message and a reply from the tree (a stats survey's, asked for
    straight on the socket): as when they arrive before ``__init__`` ends."""

    def __init__(self, *args, **kwargs):
        self.iopub_seen, self.tree_reply_seen = threading.Event(), threading.Event()
        super().__init__(*args, **kwargs)

    def _open_streams(self):
        super()._open_streams()
        msg = self.session.msg(P.STATS, content={})
        msg["content"]["msg_id"] = msg["header"]["msg_id"]
        self._broadcast_socket.send_multipart(self.session.serialize(msg))

    def _connect(self, *args, **kwargs):
        super()._connect(*args, **kwargs)  # the I/O thread runs from here on
        assert self.iopub_seen.wait(WAIT), "no IOPub message reached the new client"
        assert self.tree_reply_seen.wait(WAIT), "no reply from the tree reached the new client"

    def _read_iopub(self, frames):
        self.iopub_seen.set()
        return super()._read_iopub(frames)

    def _dispatch_broadcast(self, frames):
        self.tree_reply_seen.set()
        return super()._dispatch_broadcast(frames)


def printing_until(rc, gate):
    """Engine 0 prints (IOPub traffic every client sees) until ``gate`` exists."""
    code = (
        f"import os, time\nwhile not os.path.exists({str(gate)!r}):\n    print('tick', flush=True); time.sleep(0.02)\n"
    )
    return rc[0].execute(code, block=False)


def later_calls_complete(client):
    """A DirectView execute (its output comes over IOPub) and broadcasts in
    both reply modes all finish."""
    ar = client[:].execute("x = 1", block=False)
    ar.get(timeout=WAIT)
    assert ar.wait_for_output(timeout=WAIT), "IOPub stopped delivering"
    for coalescing in (True, False):
        view = client.broadcast_view(coalescing=coalescing)
        assert view.apply_async(lambda: 3).get(timeout=WAIT) == [3] * len(client.ids)


def test_messages_delivered_during_init_find_the_state_and_later_calls_complete(rc, tmp_path):
    gate = tmp_path / "gate"
    noise = printing_until(rc, gate)
    try:
        client = DeliveredDuringInit(connection_file(rc))
    finally:
        gate.touch()
    try:
        noise.get(timeout=WAIT)
        later_calls_complete(client)
    finally:
        client.close()


class RaisesOnce(ipb.Client):
    """A client whose handling of one chosen message raises (a bug stand-in)."""

    def __init__(self, *args, fail, **kwargs):
        self.fail = fail  # "iopub-status", "engine-reply" or "mux-reply"
        self.raised = threading.Event()
        super().__init__(*args, **kwargs)

    def _boom(self, kind):
        if self.fail == kind and not self.raised.is_set():
            self.raised.set()
            raise RuntimeError(f"injected failure handling a {kind}")

    def _read_iopub(self, frames):
        body = P.split_idents(frames)[1]  # a peek: deserialize would use up the signature
        header, content = (self.session.unpack(P.as_bytes(body[i])) for i in (1, 4))
        if header["msg_type"] == "status" and content["execution_state"] == "idle":
            self._boom("iopub-status")
        return super()._read_iopub(frames)

    def raise_in_results(self, monkeypatch):
        """Unpacking an engine's reply raises once: the usual replies are
        unpacked in one pass (``unpack_result``), the rest one by one (``outcome_result``)."""
        from ipyparallel_broadcast.client import results

        for name in ("unpack_result", "outcome_result"):
            real = getattr(results, name)

            def raising(*args, real=real):
                self._boom("engine-reply")
                return real(*args)

            monkeypatch.setattr(results, name, raising)

    def _handle_apply_reply(self, msg):
        if not is_broadcast_id(msg["parent_header"].get("msg_id", "")):
            self._boom("mux-reply")
        return super()._handle_apply_reply(msg)


def test_a_failed_iopub_status_completes_its_output_and_iopub_goes_on(rc):
    client = RaisesOnce(connection_file(rc), fail="iopub-status")
    try:
        ar = client[0].execute("print('hi')", block=False)
        ar.get(timeout=WAIT)
        assert ar.wait_for_output(timeout=WAIT), "output that cannot come was waited on"
        assert client.raised.is_set()
        later_calls_complete(client)
    finally:
        client.close()


@pytest.mark.parametrize("coalescing", [True, False], ids=["coalescing", "streaming"])
def test_a_failed_engine_reply_fails_that_engine_and_the_rest_arrive(rc, coalescing, monkeypatch):
    client = RaisesOnce(connection_file(rc), fail="engine-reply")
    client.raise_in_results(monkeypatch)
    try:
        ar = client.broadcast_view(coalescing=coalescing).apply_async(lambda: 5)
        ar.wait(timeout=WAIT)
        assert ar.ready()
        results = ar.get(return_exceptions=True)
        failed = [r for r in results if isinstance(r, Exception)]
        assert len(failed) == 1 and "could not be handled" in str(failed[0])
        assert [r for r in results if r == 5] == [5] * (len(results) - 1)
        later_calls_complete(client)
    finally:
        client.close()


def test_a_failed_mux_reply_fails_its_request_and_replies_go_on(rc):
    client = RaisesOnce(connection_file(rc), fail="mux-reply")
    try:
        ar = client[0].apply_async(lambda: 1)
        with pytest.raises(RuntimeError, match="could not handle the reply"):
            ar.get(timeout=WAIT)
        assert client[0].apply_async(lambda: 2).get(timeout=WAIT) == 2
        later_calls_complete(client)
    finally:
        client.close()


def test_iopub_handling_does_not_look_up_ipyparallel_client_at_call_time(rc, monkeypatch):
    import ipyparallel

    class Rebound(ipyparallel.Client):  # a user's subclass bound in its place
        def _dispatch_iopub(self, frames):  # its own override: no ``__wrapped__``
            return super()._dispatch_iopub(frames)

    monkeypatch.setattr(ipyparallel, "Client", Rebound)
    client = ipb.Client(connection_file(rc))
    try:
        later_calls_complete(client)
    finally:
        client.close()


def test_the_client_trims_its_heap_only_while_replies_come(rc):
    client = ipb.Client(connection_file(rc))
    try:
        assert client.heap_trim_interval == 0 and client._heap_trims.checks == 0  # off unless asked
        client.heap_trim_interval = 0.05

        def after(checks):  # the I/O thread has looked this many more times
            start = client._heap_trims.checks
            deadline = time.monotonic() + WAIT
            while client._heap_trims.checks < start + checks:
                assert time.monotonic() < deadline, "the trim check stopped running"
                time.sleep(0.01)

        after(3)
        assert client._heap_trims.trimmer.trims == 0  # no reply yet: nothing to hand back
        client.broadcast_view().apply_sync(lambda: 1)
        after(2)
        assert client._heap_trims.trimmer.trims == 1
        after(3)
        assert client._heap_trims.trimmer.trims == 1  # no replies since
    finally:
        client.close()
