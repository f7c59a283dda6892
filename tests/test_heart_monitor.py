"""The controller's heart monitor (``controller.heart``) counts the same pongs
as ipyparallel's, read once per beat: real zmq sockets, the monitor's
own beat. An answer to the last ping counts; one a beat late still
counts (ipyparallel's rule); a stale one does not; a heart that stops
answering is reported stopped after ``max_heartmonitor_misses`` beats."""

import json

import pytest
import zmq
from zmq.eventloop.zmqstream import ZMQStream

from ipyparallel_broadcast.controller.heart import DrainingHeartMonitor

pytestmark = pytest.mark.cluster


@pytest.fixture
def bed():
    ctx = zmq.Context()
    ping, pong, hub = ctx.socket(zmq.PUB), ctx.socket(zmq.ROUTER), ctx.socket(zmq.SUB)
    ping.bind_to_random_port("tcp://127.0.0.1")
    pong_url = pong.bind_to_random_port("tcp://127.0.0.1")
    monitor_port = hub.bind_to_random_port("tcp://127.0.0.1")
    hub.SUBSCRIBE = b""
    monitor_sock = ctx.socket(zmq.XPUB)
    monitor_sock.connect(f"tcp://127.0.0.1:{monitor_port}")
    for _ in range(40):  # the hub's subscription, read as ``start`` reads it (the SUB sends it
        hub.poll(50)  # once its own thread has taken the new connection in: a call on it does)
        if monitor_sock.poll(0):
            break
    else:
        pytest.fail("the hub's subscription never reached the monitor")
    assert monitor_sock.recv() == b"\x01"
    monitor = DrainingHeartMonitor(
        ping_stream=ZMQStream(ping),
        pong_stream=ZMQStream(pong),
        monitor_stream=ZMQStream(monitor_sock),
        period=100,
        max_heartmonitor_misses=1,
    )
    hearts = {}
    for name in (b"a", b"b", b"c"):
        hearts[name] = ctx.socket(zmq.DEALER)
        hearts[name].IDENTITY = name
        hearts[name].connect(f"tcp://127.0.0.1:{pong_url}")
    yield monitor, hearts, hub, pong
    for stream in (monitor.ping_stream, monitor.pong_stream, monitor.monitor_stream):
        stream.close(linger=0)
    ctx.destroy(linger=0)


def answer(monitor, hearts, names, value=None):
    payload = str(monitor.lifetime if value is None else value).encode("ascii")
    for name in names:
        hearts[name].send(payload)


def reported(monitor, hub) -> dict:
    """The hub's messages from the monitor: kind -> hearts (each waited for)."""
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


def drained(monitor, pong, n: int):
    """Read ``n`` pongs as the monitor does, each batch once the socket has one
    (waited for on its events, not for a time)."""
    total = 0
    while total < n:
        assert pong.poll(2000), f"{total} of {n} pongs came"
        total += monitor.drain()
    assert total == n


def test_pongs_count_once_per_beat_as_ipyparallels_would(bed):
    monitor, hearts, hub, pong = bed
    monitor.beat()  # ping 1
    answer(monitor, hearts, [b"a", b"b"])
    drained(monitor, pong, 2)
    monitor.beat()  # they are new hearts
    assert reported(monitor, hub) == {"new_heart": {"a", "b"}}
    assert monitor.hearts == {b"a", b"b"}

    answer(monitor, hearts, [b"a"])
    answer(monitor, hearts, [b"b"], value=monitor.last_ping)  # a beat late: still counted
    answer(monitor, hearts, [b"c"], value=-1.0)  # stale: not counted
    drained(monitor, pong, 3)
    assert monitor.responses == {b"a", b"b"}


def test_a_silent_heart_is_reported_stopped(bed):
    monitor, hearts, hub, pong = bed
    monitor.beat()
    answer(monitor, hearts, [b"a", b"b"])
    drained(monitor, pong, 2)
    monitor.beat()
    assert reported(monitor, hub) == {"new_heart": {"a", "b"}}
    for _ in range(3):  # b falls silent; max_heartmonitor_misses = 1
        answer(monitor, hearts, [b"a"])
        drained(monitor, pong, 1)
        monitor.beat()
    assert reported(monitor, hub) == {"stopped_heart": {"b"}}
    assert monitor.hearts == {b"a"}
