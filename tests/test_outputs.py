"""Outputs in the reply: our engines answer a broadcast apply with one message,
its stdout, stderr, displays and errors inside; IOPub stays silent. Stock
engines and ``stream_outputs=True`` keep ipyparallel's IOPub path.

A raw SUB socket on the client's IOPub URL counts what each request puts on
IOPub: the counts are what the lean path is for, so they are asserted.
"""

import time

import pytest
import zmq
from cluster_util import at_gate, running_cluster, until
from ipyparallel import error
from jupyter_client.session import Session

pytestmark = pytest.mark.cluster


def talk(x):
    import sys

    from IPython.display import HTML, display

    print("out", x)
    print("err", x, file=sys.stderr)
    display(HTML(f"<b>{x}</b>"))
    return x * 2


def fail():
    print("before")
    raise ValueError("boom")


def publish():
    from ipyparallel.datapub import publish_data

    publish_data({"k": 5})
    return 1


class IOPubCounter:
    """IOPub messages per (parent msg_id, msg_type), from a raw SUB socket.

    No fixed waits: a *fence* (a DirectView call, which every engine answers
    with an 'idle' status on IOPub) tells when the subscription is live, and
    when everything an engine published before it has come (one engine's
    IOPub messages stay in order through the controller's relay).
    """

    def __init__(self, rc):
        self.rc = rc
        self.session = Session(key=rc.session.key, signature_scheme=rc.session.signature_scheme)
        self.socket = zmq.Context.instance().socket(zmq.SUB)
        self.socket.linger = 0
        self.socket.subscribe(b"")
        self.socket.connect(rc._config["iopub"])
        self.seen = []
        self.idle = set()  # parent msg_ids that an 'idle' status answered
        deadline = time.monotonic() + 30
        while not self.fence(rc.ids[:1], patience=0.5):  # sent before the subscription: lost, so again
            assert time.monotonic() < deadline, "the IOPub subscription never came live"

    def fence(self, targets, patience=30.0):
        """Call ``targets`` through a DirectView; wait for their 'idle' statuses."""
        probe = self.rc[targets].apply_async(int)
        probe.get(timeout=30)
        deadline = time.monotonic() + patience
        while not self.idle.issuperset(probe.msg_ids):
            wait = deadline - time.monotonic()
            if wait <= 0 or not self.socket.poll(int(wait * 1000)):
                return False
            self.read()
        return True

    def read(self):
        _, body = self.session.feed_identities(self.socket.recv_multipart())
        msg = self.session.deserialize(body, content=True)
        parent, kind = msg["parent_header"].get("msg_id"), msg["header"]["msg_type"]
        self.seen.append((parent, kind))
        if kind == "status" and msg["content"].get("execution_state") == "idle":
            self.idle.add(parent)

    def types(self, msg_id):
        """What ``msg_id`` put on IOPub, complete: read up to a fence on every engine."""
        assert self.fence(self.rc.ids), "the fence's statuses never came"
        return sorted(t for m, t in self.seen if m == msg_id)

    def close(self):
        self.socket.close()


@pytest.fixture(scope="module")
def rc():
    with running_cluster(3, 1, 2) as client:
        yield client


@pytest.fixture
def iopub(rc):
    counter = IOPubCounter(rc)
    yield counter
    counter.close()


@pytest.mark.parametrize("coalescing", [True, False])
def test_outputs_come_in_the_reply_and_iopub_is_silent(rc, iopub, coalescing):
    view = rc.broadcast_view(coalescing=coalescing)
    ar = view.apply_async(talk, 3)
    assert ar.get(timeout=20) == [6] * 3
    assert ar.stdout == ["out 3\n"] * 3  # at once: no wait_for_output needed
    assert ar.stderr == ["err 3\n"] * 3
    assert [[o["data"]["text/html"] for o in outs] for outs in ar.outputs] == [["<b>3</b>"]] * 3
    ar.wait_for_output(timeout=20)  # resolved by the reply itself (nothing else comes)
    broadcast_id = ar._children[0].msg_id.rsplit("_", 1)[0]
    assert iopub.types(broadcast_id) == []


def test_stream_outputs_keeps_ipyparallels_iopub_path(rc, iopub):
    view = rc.broadcast_view(stream_outputs=True)
    ar = view.apply_async(talk, 4)
    assert ar.get(timeout=20) == [8] * 3
    ar.wait_for_output(timeout=20)
    assert ar.stdout == ["out 4\n"] * 3 and ar.stderr == ["err 4\n"] * 3
    assert [len(outs) for outs in ar.outputs] == [1] * 3
    broadcast_id = ar._children[0].msg_id.rsplit("_", 1)[0]
    types = iopub.types(broadcast_id)
    assert types.count("status") == 6 and types.count("stream") == 6  # busy + idle, out + err
    assert types.count("display_data") == 3


def test_errors_come_in_the_reply(rc, iopub):
    view = rc.broadcast_view()
    ar = view.apply_async(fail)
    with pytest.raises(error.CompositeError) as info:  # (grouped by equality: a GroupedCompositeError)
        ar.get(timeout=20)
    assert [e[0] for e in info.value.elist] == ["ValueError"] * 3
    assert ar.stdout == ["before\n"] * 3
    assert [md["error"].ename for md in ar.metadata] == ["ValueError"] * 3
    assert all("boom" in "".join(md["error"].traceback) for md in ar.metadata)
    broadcast_id = ar._children[0].msg_id.rsplit("_", 1)[0]
    assert iopub.types(broadcast_id) == []  # not even the 'error' message


def test_published_data_still_arrives_and_is_waited_for(rc, iopub):
    view = rc.broadcast_view()
    ar = view.apply_async(publish)
    assert ar.get(timeout=20) == [1] * 3
    ar.wait_for_output(timeout=20)
    assert ar.data == [{"k": 5}] * 3
    broadcast_id = ar._children[0].msg_id.rsplit("_", 1)[0]
    assert iopub.types(broadcast_id) == ["data_message"] * 3 + ["status"] * 3  # idle only


def test_outputs_reach_the_hub_records(rc):
    view = rc.broadcast_view()
    ar = view.apply_async(talk, 5)
    ar.get(timeout=20)
    until(
        lambda: all(r.get("stdout") for r in rc.db_query({"msg_id": {"$in": ar.msg_ids}}, keys=["msg_id", "stdout"])),
        what="hub records",
    )
    records = rc.db_query({"msg_id": {"$in": ar.msg_ids}}, keys=["stdout", "stderr"])
    assert [(r["stdout"], r["stderr"]) for r in records] == [("out 5\n", "err 5\n")] * 3


def test_stock_engines_ignore_the_request_and_use_iopub():
    with running_cluster(2, 1, 2, engine_launcher_class="local") as rc:
        counter = IOPubCounter(rc)
        try:
            view = rc.broadcast_view()
            ar = view.apply_async(talk, 6)
            assert ar.get(timeout=20) == [12] * 2
            ar.wait_for_output(timeout=20)
            assert ar.stdout == ["out 6\n"] * 2 and ar.stderr == ["err 6\n"] * 2
            broadcast_id = ar._children[0].msg_id.rsplit("_", 1)[0]
            assert counter.types(broadcast_id).count("status") == 4
        finally:
            counter.close()


def test_aborted_requests_are_answered_in_one_message(rc, iopub, tmp_path):
    view = rc.broadcast_view()
    gate = tmp_path / "gate"
    busy = view.apply_async(at_gate, str(gate))  # the engines hold it until the abort has landed
    queued = view.apply_async(talk, 7)
    rc.abort(queued, block=True)  # returns once every engine has answered the abort request
    gate.touch()
    busy.get(timeout=20)
    assert [type(r) for r in queued.get(timeout=20)] == [error.TaskAborted] * 3  # as for stream_outputs
    assert queued.wait_for_output(timeout=20)  # nothing more to wait for: no hang
    assert queued.stdout == [""] * 3
    broadcast_id = queued._children[0].msg_id.rsplit("_", 1)[0]
    assert iopub.types(broadcast_id) == []


def break_reply_outputs(broken):
    """Engine side: make (or stop making) the lean path's own plumbing raise."""
    from ipyparallel_broadcast.engine import kernel

    if broken:
        kernel.Captured._real_outputs = kernel.Captured.outputs
        kernel.Captured.outputs = lambda self: 1 / 0
    else:
        kernel.Captured.outputs = kernel.Captured._real_outputs


def test_an_engine_whose_lean_path_fails_still_answers(rc):
    """A failure in the engine's lean path (not in the user's call) is logged
    and answered with an error reply: the client never waits on that engine."""
    view = rc.broadcast_view()
    try:
        ar = view.apply_async(break_reply_outputs, True)  # its own reply is the first to fail
        ar.wait(timeout=30)
        assert ar.ready(), "an engine that failed in its lean path never answered"
        results = ar.get(return_exceptions=True)
        assert all(isinstance(r, error.RemoteError) and r.ename == "ZeroDivisionError" for r in results)
    finally:
        rc[:].apply_sync(break_reply_outputs, False)  # DirectView: not the lean path
    assert view.apply_sync(lambda: 2) == [2] * len(rc.ids)


@pytest.mark.parametrize("coalescing", [True, False])
def test_requests_that_arrive_while_an_engine_replies_are_all_read(rc, coalescing):
    """An engine sends its reply straight on its socket (not through the
    stream's queue). zmq's descriptor is edge-triggered, and that send can take
    the wakeup of a request that arrived meanwhile: the stream must still read
    it. Many small calls in flight make such arrivals common."""
    view = rc.broadcast_view(coalescing=coalescing)
    for round_ in range(40):
        ars = [view.apply_async(lambda x: x, (round_, i)) for i in range(8)]
        for i, ar in enumerate(ars):
            assert ar.get(timeout=30) == [(round_, i)] * len(rc.ids)
    for i in range(40):  # pushes and pulls back to back, as the user's script does
        view.push({"v": i}, block=True)
        assert view.pull("v", block=True) == [i] * len(rc.ids)
