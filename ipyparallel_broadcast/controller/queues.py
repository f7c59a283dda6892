"""The controller's mux and control queues, in place of ipyparallel's.

ipyparallel relays DirectView's requests (mux) and control messages between
clients and engines with pyzmq's compiled ``monitored_queue``: two ROUTER
sockets, each message's first two frames (sender, recipient) swapped, a copy
to the hub's monitor. A message of a single frame after the sender's identity
breaks that device for good: every later request through it is lost, and each
waits forever (found by the chaos soak: a nemesis's junk to the mux hung
every client's next DirectView ``scatter`` and ``map``). Here the same relay is
a few lines of Python that drop such a message (counted, logged once) and
go on; what it relays is unchanged.

A queue restarted after its process died (``supervise``) binds the same
ports, and engines and clients reconnect to it within ZeroMQ's reconnect
interval. A request for an engine not connected yet would be dropped by the
ROUTER, and wait forever; here it is held (``HeldForPeers``), in order, and sent when
the engine is there, or dropped and logged after ``HOLD`` seconds (an engine
that is gone: the hub fails what was sent to it when it unregisters it).
"""

from __future__ import annotations

import logging
import signal
import time
from collections import OrderedDict, deque

import zmq

log = logging.getLogger(__name__)
DRAIN = 256  # messages relayed from one side per wake-up at most
HOLD = 5.0  # seconds a message waits for its engine to (re)connect
RETRY = 20  # milliseconds between tries to send what is held


class HeldForPeers:
    """Messages for peers not connected yet, per peer, in order, each with
    the time it came. Sans-I/O: ``send(frames) -> bool`` tries one."""

    def __init__(self, hold: float = HOLD, clock=time.monotonic):
        self.hold, self.clock = hold, clock
        self.peers: OrderedDict[bytes, deque] = OrderedDict()
        self.expired = 0

    def __bool__(self):
        return bool(self.peers)

    def blocks(self, peer: bytes) -> bool:
        """Whether a message for ``peer`` must wait behind others."""
        return peer in self.peers

    def add(self, peer: bytes, msg: list):
        self.peers.setdefault(peer, deque()).append((self.clock(), msg))

    def retry(self, send) -> list[bytes]:
        """Send what can go, in order per peer; drop what waited too long.
        Returns the peers whose messages were dropped."""
        now, dropped = self.clock(), []
        for peer in list(self.peers):
            waiting = self.peers[peer]
            while waiting and send(waiting[0][1]):
                waiting.popleft()
            if waiting and now - waiting[0][0] > self.hold:
                self.expired += len(waiting)
                dropped.append(peer)
                waiting.clear()
            if not waiting:
                del self.peers[peer]
        return dropped


def server_socket(ctx: zmq.Context, kind: int, spec: dict) -> zmq.Socket:
    """A socket clients or engines connect to (a CurveZMQ server when curve is on)."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.SNDHWM = sock.RCVHWM = 0  # as ipyparallel's queues: a ROUTER at its mark drops
    if spec.get("curve_secretkey"):
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_SECRETKEY, spec["curve_secretkey"])
    return sock


def monitor_socket(ctx: zmq.Context, spec: dict):
    """The PUB that copies traffic to the hub's monitor (a curve client), or None."""
    if not spec.get("monitor_url"):
        return None
    sock = ctx.socket(zmq.PUB)
    sock.setsockopt(zmq.LINGER, 0)
    if spec.get("curve_secretkey"):
        public, secret = zmq.curve_keypair()
        sock.setsockopt(zmq.CURVE_SERVERKEY, spec["curve_publickey"])
        sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
    sock.connect(spec["monitor_url"])
    return sock


class RouterQueue:
    """Two ROUTERs, ``in`` (clients) and ``out`` (engines): each message goes
    to the other side with its sender and recipient frames swapped; the monitor
    gets it too, prefixed by the side it came from."""

    def __init__(self, ctx: zmq.Context, spec: dict):
        self.ins = server_socket(ctx, zmq.ROUTER, spec)
        self.outs = server_socket(ctx, zmq.ROUTER, spec)
        self.outs.ROUTER_MANDATORY = 1  # an engine not connected: held, not dropped
        self.held = HeldForPeers(spec.get("hold", HOLD))
        self.ins.IDENTITY, self.outs.IDENTITY = spec["in_identity"], spec["out_identity"]
        self.ins.bind(spec["in_url"])
        self.outs.bind(spec["out_url"])
        self.monitor = monitor_socket(ctx, spec)
        self.prefixes = {self.ins: spec["in_prefix"], self.outs: spec["out_prefix"]}
        self.other = {self.ins: self.outs, self.outs: self.ins}
        self.poller = zmq.Poller()
        for sock in (self.ins, self.outs):
            self.poller.register(sock, zmq.POLLIN)
        self.dropped = 0

    def once(self, timeout=None) -> int:
        """Relay what waits on either side; returns how many messages went."""
        relayed = 0
        if self.held:
            timeout = RETRY if timeout is None else min(timeout, RETRY)
        for sock in dict(self.poller.poll(timeout)):
            for _ in range(DRAIN):
                try:
                    msg = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                if len(msg) < 3:  # sender, recipient, and at least one frame of message
                    self.dropped += 1
                    if self.dropped == 1:
                        log.warning(
                            "%s queue: dropped a message of %d frames (more are counted, not logged)",
                            self.prefixes[sock].decode(),
                            len(msg),
                        )
                    continue
                msg[0], msg[1] = msg[1], msg[0]
                if sock is self.ins:
                    self.to_engine(msg)
                else:
                    self.ins.send_multipart(msg, copy=False)
                if self.monitor is not None:
                    self.monitor.send_multipart([self.prefixes[sock], *msg], copy=False)
                relayed += 1
        if self.held:
            for peer in self.held.retry(self._send_out):
                log.error(
                    "%s queue: engine %r not connected after %g s; requests dropped", self.name, peer, self.held.hold
                )
        return relayed

    @property
    def name(self) -> str:
        return self.prefixes[self.ins].decode()

    def to_engine(self, msg: list):
        peer = msg[0].bytes
        if self.held.blocks(peer) or not self._send_out(msg):
            self.held.add(peer, msg)

    def _send_out(self, msg: list) -> bool:
        try:
            self.outs.send_multipart(msg, copy=False)
        except zmq.ZMQError as e:
            if e.errno == zmq.EHOSTUNREACH:
                return False
            raise
        return True


def run_relay(make, spec: dict, in_process: bool, what: str):
    """Run ``make(context, spec).once()`` until the context ends (a process, or
    a thread with ``in_process=False``). An exception is logged with ``what``
    and the relay goes on: one bad message must not stop every client."""
    if in_process:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    relay = make(zmq.Context() if in_process else zmq.Context.instance(), spec)
    while True:
        try:
            relay.once()
        except zmq.ContextTerminated:
            return
        except Exception:
            log.exception("%s: a message could not be relayed", what)


def run_router_queue(spec: dict, in_process: bool = True):
    """Entry point: the mux or control queue, until terminated."""
    run_relay(RouterQueue, spec, in_process, f"{spec['in_prefix'].decode()} queue")
