"""What one engine's answer to one request costs, against floors without IPython.

    python benchmarks/scripts/engine_floor.py --calls 3000 --out benchmarks/results/engine-floor.md

One process answers requests one at a time, sent by this one over TCP on
loopback; its CPU (all threads, on its own clock) per request is measured:

- ``pyzmq, blocking``: a DEALER that sends back every message as it came
  (``recv_multipart``/``send_multipart``, no event loop): the floor of a
  Python process that answers a zmq message;
- ``pyzmq, ZMQStream``: the same on tornado's asyncio loop (what ipykernel runs);
- ``pyzmq, ZMQStream, signed apply``: the same, checking and parsing the
  request (``wire.protocol.Codec``), running it (``engine.applycall``) and
  sending a signed reply: an engine loop of our own, without IPython;
- ``our engine, broadcast apply``: a real engine (ipykernel, IPython) answering
  our BroadcastView (the lean path: one reply, outputs in it);
- ``our engine, DirectView apply``: the same engine on ipykernel's path (IOPub
  busy and idle, the reply).

Each request is a 1 kB echo's ``apply_request``, as the client packs it.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time

import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import report  # noqa: E402

from ipyparallel_broadcast.tools import bench  # noqa: E402

KEY = b"engine-floor"
WARM = 200  # calls before the measured ones


def requests(n: int) -> list[list[bytes]]:
    """``n`` signed 1 kB echo ``apply_request``s (each its own id: a signature
    seen before is refused as a replay), as our BroadcastView packs them."""
    from ipyparallel.serialize import pack_apply_message
    from jupyter_client.session import Session

    from ipyparallel_broadcast.wire.protocol import OUTPUTS_KEY

    session = Session(key=KEY)
    bufs = [bytes(memoryview(b)) for b in pack_apply_message(bench.echo, (bench.ECHO,), {})]
    return [
        [bytes(f) for f in session.serialize(session.msg("apply_request", content={}, metadata={OUTPUTS_KEY: "reply"}))]
        + bufs
        for _ in range(n)
    ]


def serve(addr: str, kind: str):
    """Answer every request on ``addr`` (runs in a child process)."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.connect(addr)
    if kind == "blocking":
        sock.send(b"hello")  # the driver learns this socket's routing id
        while True:
            sock.send_multipart(sock.recv_multipart(copy=False), copy=False)
    from tornado.ioloop import IOLoop
    from zmq.eventloop.zmqstream import ZMQStream

    stream = ZMQStream(sock)
    if kind == "stream":
        stream.on_recv(lambda frames: sock.send_multipart(frames, copy=False), copy=False)
    else:
        stream.on_recv(_applier(sock), copy=False)
    loop = IOLoop.current()
    loop.add_callback(sock.send, b"hello")  # once the stream watches the socket
    loop.start()


def _applier(sock):
    from jupyter_client.session import Session

    from ipyparallel_broadcast.engine.applycall import Functions, run_apply
    from ipyparallel_broadcast.wire import protocol as P

    session = Session(key=KEY)
    codec, functions, namespace = P.Codec(session), Functions(), {}

    def failed(e):
        return dict(status="error", ename=type(e).__name__, evalue=str(e), traceback=[])

    def answer(frames):
        request = codec.unpack(frames[1:])  # [DELIM, sig, header, parent, metadata, content, *buffers]
        content, buffers = run_apply(request["buffers"], namespace, functions, 1024, 64, failed)
        reply = codec.serialize("apply_reply", content, request["raw_header"], {"status": content["status"]})
        sock.send_multipart(reply + list(buffers), copy=False)

    return answer


def floor(kind: str, calls: int) -> tuple[float, float]:
    """CPU µs per request of a ``serve`` child, and the median round trip (µs)."""
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    child = multiprocessing.get_context("spawn").Process(target=serve, args=(f"tcp://127.0.0.1:{port}", kind))
    child.start()
    try:
        todo = iter(requests(calls + WARM))
        if not sock.poll(60_000):
            raise RuntimeError(f"the {kind!r} child did not say hello")
        peer = sock.recv_multipart()[0]  # its routing id (a ROUTER cannot speak first)
        return _timed(lambda: (sock.send_multipart([peer] + next(todo)), sock.recv_multipart()), child.pid, calls)
    finally:
        child.kill()
        child.join()
        sock.close(0)


def _timed(call, pid: int, calls: int) -> tuple[float, float]:
    for _ in range(WARM):
        call()
    clock = bench.process_cpu_clock(pid)
    cpu, walls = time.clock_gettime(clock), []
    for _ in range(calls):
        tic = time.perf_counter()
        call()
        walls.append(time.perf_counter() - tic)
    cpu = time.clock_gettime(clock) - cpu
    walls.sort()
    return 1e6 * cpu / calls, 1e6 * walls[len(walls) // 2]


def engine(calls: int) -> dict[str, tuple[float, float]]:
    with bench.our_cluster(1, 0) as (rc, _):
        pid = rc[0].apply_sync(os.getpid)
        views = {"broadcast apply": rc.broadcast_view(coalescing=True), "DirectView apply": rc[0]}
        return {name: _timed(lambda v=v: v.apply_sync(bench.echo, bench.ECHO), pid, calls) for name, v in views.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    rows = {
        "pyzmq, blocking": floor("blocking", args.calls),
        "pyzmq, ZMQStream": floor("stream", args.calls),
        "pyzmq, ZMQStream, signed apply": floor("apply", args.calls),
    }
    rows.update({f"our engine, {name}": v for name, v in engine(args.calls).items()})
    lines = [
        __doc__.split("\n\n", 2)[2].strip(),
        "",
        f"{args.calls} requests each, one at a time; the answering process's CPU per request "
        "(all its threads) and the median round trip.",
        "",
        "| answered by | CPU per request (µs) | round trip (µs) |",
        "|---|---:|---:|",
        *(f"| {name} | {cpu:.0f} | {wall:.0f} |" for name, (cpu, wall) in rows.items()),
    ]
    report("engine_floor.py", argv, "One engine's answer to one request, against its floors", lines, args.out)


if __name__ == "__main__":
    main()
