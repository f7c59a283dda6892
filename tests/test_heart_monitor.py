"""The controller's heart monitor (``controller.heart``): its pong socket is
not watched by the event loop (no wake-up per pong), and its beat counts the
same pongs as ipyparallel's, with real zmq sockets: an answer to the last
ping counts; one a beat late still counts (ipyparallel's rule); a stale one
does not; a heart that stops answering is reported stopped after
``max_heartmonitor_misses`` beats."""

import json

import pytest
import zmq

from ipyparallel_broadcast.controller.heart import DrainingHeartMonitor

pytestmark = pytest.mark.cluster


@pytest.fixture
def bed():
    from zmq.eventloop.zmqstream import ZMQStream

    ctx = zmq.Context()
    ping, pong, hub = ctx.socket(zmq.PUB), ctx.socket(zmq.ROUTER), ctx.socket(zmq.SUB)
    ping.bind_to_random_port("tcp://127.0.0.1")
    pong_port = pong.bind_to_random_port("tcp://127.0.0.1")
    monitor_port = hub.bind_to_random_port("tcp://127.0.0.1")
    hub.SUBSCRIBE = b""
    monitor_sock = ctx.socket(zmq.XPUB)
    monitor_sock.connect(f"tcp://127.0.0.1:{monitor_port}")
    monitor = DrainingHeartMonitor(
        ping_stream=ZMQStream(ping),
        pong_stream=ZMQStream(pong),
        monitor_stream=ZMQStream(monitor_sock),
        period=100_000,  # (beats are made by the tests)
        max_heartmonitor_misses=1,
    )
    for _ in range(40):  # the hub's subscription, which ``start`` waits for (the SUB sends it
        hub.poll(50)  # once its own thread has taken the new connection in: a call on it does)
        if monitor_sock.poll(0):
            break
    else:
        pytest.fail("the hub's subscription never reached the monitor")
    monitor.start()
    hearts = {}
    for name in (b"a", b"b", b"c"):
        hearts[name] = ctx.socket(zmq.DEALER)
        hearts[name].IDENTITY = name
        hearts[name].connect(f"tcp://127.0.0.1:{pong_port}")
    yield monitor, hearts, hub, pong
    monitor.caller.stop()
    for stream in (monitor.ping_stream, monitor.pong_stream, monitor.monitor_stream):
        stream.close(linger=0)
    ctx.destroy(linger=0)


def answer(monitor, hearts, names, value=None):
    payload = str(monitor.lifetime if value is None else value).encode("ascii")
    for name in names:
        hearts[name].send(payload)


def read_pongs(monitor, pong, n: int):
    """``n`` pongs read as the beat reads them (``drain``), each batch once the
    socket has one (waited for on its events, not for a time)."""
    read = 0
    while read < n:
        assert pong.poll(2000), f"{read} of {n} pongs came"
        read += monitor.drain()
    assert read == n


def reported(monitor, hub) -> dict:
    """The hub's messages from the monitor: kind -> hearts."""
    monitor.monitor_stream.flush()  # (a ZMQStream sends from its event loop; none runs here)
    told = {}
    while hub.poll(1000):
        frames = hub.recv_multipart()
        i = frames.index(b"<IDS|MSG>")
        header, content = json.loads(frames[i + 2]), json.loads(frames[i + 5])
        told.setdefault(header["msg_type"], set()).update(content["hearts"])
        if not hub.poll(50):
            break
    return told


def test_the_pong_socket_wakes_no_loop(bed):
    monitor = bed[0]
    stream = monitor.pong_stream
    assert stream.socket.fileno() not in stream.io_loop.handlers
    assert stream.receiving()  # (a pong that comes between the drain and the beat's flush: the flush's)


def test_pongs_count_as_ipyparallels_do(bed):
    monitor, hearts, hub, pong = bed
    monitor.beat()  # ping 1
    answer(monitor, hearts, [b"a", b"b"])
    read_pongs(monitor, pong, 2)
    monitor.beat()  # they are new hearts
    assert reported(monitor, hub) == {"new_heart": {"a", "b"}}
    assert monitor.hearts == {b"a", b"b"}

    answer(monitor, hearts, [b"a"])
    answer(monitor, hearts, [b"b"], value=monitor.last_ping)  # a beat late: still counted
    answer(monitor, hearts, [b"c"], value=-1.0)  # stale: not counted
    read_pongs(monitor, pong, 3)
    assert monitor.responses == {b"a", b"b"}


def test_a_silent_heart_is_reported_stopped(bed):
    monitor, hearts, hub, pong = bed
    monitor.beat()
    answer(monitor, hearts, [b"a", b"b"])
    read_pongs(monitor, pong, 2)
    monitor.beat()
    assert reported(monitor, hub) == {"new_heart": {"a", "b"}}
    for _ in range(3):  # b falls silent; max_heartmonitor_misses = 1
        answer(monitor, hearts, [b"a"])
        read_pongs(monitor, pong, 1)
        monitor.beat()
    assert reported(monitor, hub) == {"stopped_heart": {"b"}}
    assert monitor.hearts == {b"a"}
