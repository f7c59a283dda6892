"""Nothing lost, nothing hangs on IOPub (issue 32): a new client's first
outputs are never dropped by ZeroMQ's slow joiner, output that cannot come
ends the wait with the engine named, and a request sent to an engine just as
it is unregistered fails instead of waiting forever."""

import glob
import os
import signal
import threading

import ipyparallel as ipp
import pytest
import zmq
from cluster_util import running_cluster, until
from jupyter_client.session import Session

import ipyparallel_broadcast as ipb
from ipyparallel_broadcast.controller.iopubrelay import HELLO_PREFIX, WELCOME, Hellos
from ipyparallel_broadcast.tools.bench import chatter

N = 4
MODES = {"coalescing": True, "streaming": False, "batch2": ipb.Batch(2)}


@pytest.fixture(scope="module")
def rc():
    with running_cluster(N, 1, 2) as client:
        yield client


def connect(rc, cls=ipb.Client):
    """Another client of the cluster, as a new user's process connects."""
    (url_file,) = glob.glob(os.path.join(rc.test_profile_dir, "security", "*-client.json"))
    return cls(url_file)


# --------------------------------------------------------------------- pure
@pytest.mark.pure
def test_a_hello_answers_a_hello_subscription_only_signed_on_its_topic():
    session = Session(key=b"k")
    hellos = Hellos(session)
    for frame in (b"\x01", b"\x01other", b"\x00" + HELLO_PREFIX + b"s", b"", HELLO_PREFIX + b"s"):
        assert hellos.answer(frame) is None
    frames = hellos.answer(b"\x01" + HELLO_PREFIX + b"abc")
    idents, body = session.feed_identities(frames)
    assert idents == [HELLO_PREFIX + b"abc"]
    msg = session.deserialize(body)  # checks the signature
    assert msg["header"]["msg_type"] == WELCOME and msg["parent_header"] == {}
    assert hellos.sent == 1


# ---------------------------------------------------------------- clusters
@pytest.mark.cluster
def test_new_clients_under_iopub_load_miss_no_output(rc):
    """Clients connect in turn while every engine prints each millisecond;
    each one's first execute gets every engine's output, on DirectView and in
    every broadcast mode."""
    rc[:].apply_sync(chatter)
    missed = []
    for k in range(6):
        client = connect(rc)
        try:
            assert client._iopub_liveness.live.is_set() and client.iopub_wait is not None
            views = [client[:]] + [client.broadcast_view(coalescing=m) for m in MODES.values()]
            view = views[k % len(views)]
            ar = view.execute(f"print('hello {k}')", block=False)
            ar.get(timeout=60)
            assert ar.wait_for_output(60)
            for out in ar.stdout:
                if f"hello {k}" not in out:
                    missed.append((k, type(view).__name__, out[-80:]))
        finally:
            client.close()
    assert missed == []


@pytest.mark.cluster
def test_output_that_cannot_come_ends_the_wait_naming_the_engine(rc):
    """IOPub lost (the client unsubscribes): wait_for_output() ends once the
    output is overdue, each engine's stderr says why, on both paths."""
    client = connect(rc)
    try:
        client.output_timeout = 1.0
        done = threading.Event()

        def unsubscribe():
            client._iopub_socket.setsockopt(zmq.UNSUBSCRIBE, b"")
            done.set()

        client._io_loop.add_callback(unsubscribe)
        assert done.wait(10)
        for view in (client[:2], client.broadcast_view([0, 1], coalescing=False)):
            ar = view.execute("print('lost')", block=False)
            ar.get(timeout=60)
            assert ar.wait_for_output(60)
            for eid, err in zip([0, 1], ar.stderr):
                assert f"output from engine {eid} may be incomplete" in err and "'idle' status" in err
    finally:
        client.close()


@pytest.mark.cluster
def test_a_stock_client_on_our_controller_gets_outputs_and_ignores_hellos(rc, caplog):
    client = connect(rc, ipp.Client)
    try:
        ar = client[:].execute("print('stock')", block=False)
        ar.get(timeout=60)
        assert ar.wait_for_output(60) and all("stock" in s for s in ar.stdout)
        other = connect(rc)  # its hello reaches this client too
        other.close()
        ar = client[:].execute("print('again')", block=True)
        assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
    finally:
        client.close()


@pytest.mark.cluster
def test_our_client_on_a_stock_controller_waits_for_a_live_subscription(tmp_path):
    cluster = ipp.Cluster(n=1, profile_dir=str(tmp_path), log_level=40)
    stock = cluster.start_and_connect_sync()
    try:
        stock.wait_for_engines(1, timeout=60)
        client = ipb.Client(profile_dir=str(tmp_path), cluster_id=cluster.cluster_id)
        try:
            assert client._iopub_liveness.live.is_set()  # the engine's status answered the probe
            ar = client[:].execute("print('probe')", block=False)
            ar.get(timeout=60)
            assert ar.wait_for_output(60) and "probe" in ar.stdout[0]
        finally:
            client.close()
    finally:
        stock.close()
        cluster.stop_cluster_sync()


@pytest.mark.cluster
def test_a_request_to_an_engine_unregistered_before_it_is_sent_fails(rc):
    """ipyparallel files a request under its engine only if the engine is
    registered at that moment, and fails filed requests when it unregisters:
    one sent across that moment waited forever (the scatter hang of issue 32)."""
    eid = rc.ids[-1]
    uuid = rc._engines[eid]
    pid = rc[eid].apply_sync(os.getpid)
    os.kill(pid, signal.SIGKILL)
    until(lambda: eid not in rc.ids, what="the engine to be unregistered")
    future = rc.send_apply_request(rc._mux_socket, os.getpid, ident=uuid.encode())
    assert future.wait(30)
    result = future.result()
    assert getattr(result, "ename", None) == "EngineError" and "is gone" in str(result)
