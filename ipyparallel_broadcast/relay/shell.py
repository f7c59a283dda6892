"""One relay node as a process: zmq sockets around a ``RelayNode``.

Sockets:
  up    root: ROUTER bound for clients; others: DEALER to the parent's ``down``
  down  ROUTER (``ROUTER_MANDATORY``) bound for children, or for engines at a leaf
  hub   leaves only: SUB to the hub's notifications, DEALER to its registrar
  mon   root and leaves: PUB to the hub's monitor, copies for its task records

With ``enable_curve`` every one of them, links between nodes included, uses
CurveZMQ with the controller's keys, as the rest of the controller does.
"""

from __future__ import annotations

import gc
import logging
import signal
import sys
import time

import psutil
import zmq
from jupyter_client.session import Session

from ..host.shm import THRESHOLD, ShmStore, sweep
from ..host.trim import HeapTrimmer
from ..wire import protocol as P
from ..wire.frames import recv_frames, send_frames
from ..wire.topology import HOST_PREFIX, TreeShape, node_identity, node_name
from .dataplane.chunks import BULK
from .events import DOWN, HUB, JOINED, MON, PULSE, UP, Send
from .forwarding import DEFAULT_HOST_FANOUT
from .loop import ShellLoop
from .node import RelayNode
from .startup import StartupHold

BATCH = 256  # messages taken from one socket before looking at the others


def _curve_server(sock, curve: dict):
    if curve["curve_secretkey"]:
        sock.curve_server, sock.curve_secretkey = True, curve["curve_secretkey"]


def _bind(sock, url: str, curve: dict):
    """Bind, a CurveZMQ server when the cluster has keys (as ipyparallel's
    ``util.bind``: importing ipyparallel would cost a host relay 140 ms and 25 MB)."""
    _curve_server(sock, curve)
    sock.bind(url)


def _connect(sock, url: str, curve: dict):
    """Connect, a CurveZMQ client of keys of its own when the cluster has keys
    (as ipyparallel's ``util.connect``)."""
    if curve["curve_serverkey"]:
        public, secret = curve["curve_publickey"], curve["curve_secretkey"]
        if not (public and secret):
            public, secret = zmq.curve_keypair()
        sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = curve["curve_serverkey"], public, secret
    sock.connect(url)


def session_from(spec: dict) -> Session:
    return Session(
        key=spec["key"].encode(),
        signature_scheme=spec["signature_scheme"],
        packer=spec["packer"],
        unpacker=spec["unpacker"],
        digest_history_size=spec.get("digest_history_size", 2**16),
    )


class NodeShell:
    def __init__(self, spec: dict, context: zmq.Context | None = None):
        self.spec = spec
        self.context = context or zmq.Context()
        path = tuple(spec["path"])
        shape = TreeShape(spec["depth"], spec["fanout"])
        self.log = logging.getLogger(f"ipyparallel_broadcast.node.{node_name(path)}")
        self.codec = P.Codec(session_from(spec))
        self.node = RelayNode(
            self.codec,
            shape,
            path,
            ping_interval=spec.get("ping_interval", 0.5),
            node_timeout=spec.get("node_timeout", 10.0),
            host=spec.get("host"),
            store=ShmStore(threshold=spec.get("shm_threshold") or THRESHOLD) if spec.get("shm", True) else None,
            bulk=spec.get("bulk"),
            coalesce=True,  # streamed replies read together go up together (``drained``)
            records=bool(spec.get("monitor_url")),
            probe=self.facts,
            host_fanout=spec.get("host_fanout", DEFAULT_HOST_FANOUT),
        )
        self.feeds: dict = {}  # bulk url -> a DEALER to that host relay's bulk socket
        self.trimmer = HeapTrimmer(spec.get("trim_interval", 10.0))
        self.process, self.down_url = psutil.Process(), spec["down_url"]
        self.busy = 0.0  # seconds spent handling messages (where the time goes)
        # peers not connected yet in the node's first seconds (a restarted controller's tree)
        self.startup = StartupHold(time.monotonic, spec.get("node_timeout", 10.0))
        self.loop: ShellLoop | None = None  # the loop polling this shell's sockets, once it runs
        curve = dict(
            curve_secretkey=spec.get("curve_secretkey"),
            curve_publickey=spec.get("curve_publickey"),
            curve_serverkey=spec.get("curve_serverkey"),
        )
        self.open_sockets(spec, curve)

    def facts(self) -> dict:
        """This process's facts, in its node's survey."""
        return dict(
            rss=self.process.memory_info().rss,
            pid=self.process.pid,
            down_url=self.down_url,
            busy=self.busy,
            cpu=time.process_time(),  # all threads, ns clock (psutil's: 10 ms ticks)
            blocks=sys.getallocatedblocks(),  # Python's heap, apart from the allocator's and zmq's
            trims=self.trimmer.trims,  # freed heap handed back to the OS (``host.trim``)
            node_timeout=self.node.node_timeout,  # (a host relay's come from the controller's config)
            ping_interval=self.node.ping_interval,
        )

    def open_sockets(self, spec, curve):
        ctx = self.context
        # options first: a socket's pipes take the options in force when it
        # binds or connects (a high-water mark set later would leave the
        # default 1,000 messages, and a ROUTER silently drops past it)
        self.up = _socket(ctx, zmq.ROUTER if self.node.is_root else zmq.DEALER)
        if self.node.is_root:
            _bind(self.up, spec["up_url"], curve)
        else:
            self.up.IDENTITY = node_identity(self.node.path)
            _connect(self.up, spec["up_url"], curve)  # links between nodes: curve too
        self.down = _socket(ctx, zmq.ROUTER)
        self.down.ROUTER_MANDATORY = 1
        self.down.ROUTER_HANDOVER = 1  # a restarted child takes its identity back
        _bind(self.down, spec["down_url"], curve)
        self.sockets = [self.up, self.down]
        self.pulse = None
        if self.node.is_leaf and spec["down_url"].startswith("tcp://"):  # host relays may hang here
            self.pulse = _socket(ctx, zmq.ROUTER)
            self.pulse.ROUTER_MANDATORY = 1
            self.pulse.ROUTER_HANDOVER = 1
            _curve_server(self.pulse, curve)
            self.node.heartbeats.links(pulse_port=self.pulse.bind_to_random_port(spec["down_url"].rsplit(":", 1)[0]))
            self.sockets.append(self.pulse)
        self.notifications = self.registrar = None
        self.lookup_in_flight = False
        if self.node.is_leaf and spec.get("notification_url"):
            self.notifications = _socket(ctx, zmq.SUB)
            self.notifications.SUBSCRIBE = P.HUB_TOPIC  # the hub's own: no stock replay (controller.roster)
            self.notifications.SUBSCRIBE = P.BATCH_TOPIC  # engines registered by host, a batch each
            _connect(self.notifications, spec["notification_url"], curve)
            self.registrar = _socket(ctx, zmq.DEALER)
            _connect(self.registrar, spec["registration_url"], curve)
            self.sockets += [self.notifications, self.registrar]
        self.monitor = None
        if spec.get("monitor_url") and (self.node.is_root or self.node.is_leaf):
            self.monitor = _socket(ctx, zmq.PUB)
            _connect(self.monitor, spec["monitor_url"], curve)
        self.handlers = {
            self.up: self.node.on_up,
            self.down: self.node.on_down,
            self.notifications: self.node.on_hub,
            self.pulse: self.node.on_pulse,
            self.registrar: self.on_registry,
        }

    # --------------------------------------------------------------- events
    def on_registry(self, frames) -> list[Send]:
        self.lookup_in_flight = False
        return self.node.on_hub(frames)

    def ask_hub(self):
        if self.registrar is not None and not self.lookup_in_flight:
            self.lookup_in_flight = True
            self.registrar.send_multipart(self.codec.pack("connection_request", {P.TABLE_ONLY: True}))

    # ----------------------------------------------------------------- sends
    def perform(self, sends: list[Send]):
        while sends:
            send = sends.pop(0)
            if send.socket == UP:
                self.send_up(send.frames)
            elif send.socket == MON:
                send_frames(self.monitor, send.frames)
            elif send.socket == HUB:
                self.ask_hub()
            elif send.socket == JOINED:
                self.on_joined(send.frames)
            elif send.socket == PULSE:
                self.send_pulse(send.frames)
            elif send.socket == BULK:
                self.send_bulk(send.frames)
            elif send.socket == DOWN:
                if self.startup.held and self.startup.waiting(send.frames):  # behind one held
                    continue
                try:
                    send_frames(self.down, send.frames)
                except zmq.ZMQError as e:
                    if e.errno != zmq.EHOSTUNREACH:
                        raise
                    if P.as_bytes(send.frames[1]) == P.HELLO_KEY or not self.startup.hold(send.frames):
                        sends.extend(self._unreachable(*send.frames[:2]))

    def send_up(self, frames):
        send_frames(self.up, frames)

    def send_pulse(self, frames):
        """A ping to a host relay on the pulse link; one not connected there
        is pinged on its data link from now on (``children``)."""
        try:
            send_frames(self.pulse, frames)
        except zmq.ZMQError as e:
            if e.errno != zmq.EHOSTUNREACH:
                raise
            self.node.children.pulse_unreachable(P.as_bytes(frames[0]))

    def send_bulk(self, frames):
        """A chunk to a host relay's bulk socket: ``[url, its identity, *message]``
        (one DEALER per host fed, made at first use; curve: that relay's derived keys)."""
        url = P.as_bytes(frames[0]).decode()
        if len(frames) == 1:  # that host relay is lost: drop the chunks still queued for it
            if url in self.feeds:
                self.feeds.pop(url).close()
            return
        sock = self.feeds.get(url)
        if sock is None:
            sock = self.feeds[url] = _socket(self.context, zmq.DEALER)
            if self.node.host:  # a host relay: outcomes passed back name it (``forwarding``)
                sock.IDENTITY = self.up.IDENTITY
            if self.spec.get("curve_serverkey") or self.spec.get("curve_secretkey"):
                from ..host.link import Place  # the keys every engine of the cluster derives

                label = P.as_bytes(frames[1])[len(HOST_PREFIX) :].decode()
                sock.curve_serverkey = Place(self.spec["key"].encode(), label, curve=True).public
                sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
            sock.connect(url)
        send_frames(sock, frames[2:])

    def on_joined(self, who: list):
        """Engines whose join is complete (host relays answer them)."""

    def _unreachable(self, peer, key=b"") -> list[Send]:
        peer = P.as_bytes(peer)
        if P.as_bytes(key) == P.HELLO_KEY:  # a greeting: the engine is not connected here (yet)
            self.node.sharing.undelivered(peer.decode())
            return []
        if peer.startswith(HOST_PREFIX):
            return self.node.on_child_lost(peer, "is down (its link is closed)")
        if self.node.is_leaf:
            return self.node.on_engine_lost(peer.decode(), "is not connected")
        return self.node.on_child_lost(self.node.children.key_of(peer), "is down (its link is closed)")

    # ------------------------------------------------------------------ loop
    def start(self):
        """Serve until ``running`` says stop: this shell alone on a ``ShellLoop``."""
        settle_gc()
        loop = ShellLoop()
        loop.add(self)
        loop.run()

    def begin(self):
        """What a shell does before its sockets are polled (``ShellLoop.add``)."""
        if self.node.sharing.on:  # segments of relays that died (SIGKILL) go now
            for name in sweep():
                self.log.info("removed %s, left by a relay that is gone", name)
        if self.node.is_leaf:
            self.ask_hub()
        self.perform(self.node.heartbeats.hello())
        self.log.info(
            "relay node %s up (%s), %d engine(s) known",
            self.node.name,
            "leaf" if self.node.is_leaf else "interior",
            len(self.node.engines),
        )

    def read(self, sock):
        """``sock`` is ready: up to ``BATCH`` of its messages, each handled and its sends performed."""
        handler = self.handlers[sock]
        if not self.trimmer.owed:
            self.trimmer.owe()
        for _ in range(BATCH):
            try:
                frames = recv_frames(sock)
            except zmq.Again:
                break
            tic = time.perf_counter()
            try:
                self.perform(handler(frames))
            except Exception:  # a bug must not take the node down
                self.log.exception("error handling a message")
            self.busy += time.perf_counter() - tic

    def after_turn(self, ticked: bool):
        """The loop read what came (or a deadline came): what was held goes, timers fire."""
        self.perform(self.drained())
        if self.trimmer.owed:
            self.trimmer.maybe()
        if ticked:
            self.on_tick()

    def finish(self):
        """The loop stopped serving this shell."""

    def drained(self):
        """Every socket read: what was held for the batch goes now."""
        return self.node.on_drained()

    def on_tick(self):
        self.perform([Send(DOWN, frames) for frames in self.startup.take()] + self.node.on_tick())

    def running(self) -> bool:
        return True

    def next_deadline(self):
        node, trim, held = self.node.next_deadline(), self.trimmer.next_due(), self.startup.due
        due = node if trim is None else trim if node is None else min(node, trim)
        return due if held is None else held if due is None else min(due, held)  # (asked every loop turn)


GC_THRESHOLD = (50_000, 20, 100)  # a node's young garbage: collected per 50,000 objects, not 700


def settle_gc():
    """A relay process's own garbage collection, set once it is up: what
    start-up made (modules, the codec, the tables; for a forked node, the
    controller's whole heap) is frozen out of every later collection, so a
    collection never walks it (nor dirties a forked node's shared pages), and
    the young generation is collected per 50,000 new objects instead of 700.
    A node's per-message objects (frame lists, headers, dicts) are freed by
    their reference counts; the collector only finds the rare cycle."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)


def _socket(ctx, kind) -> zmq.Socket:
    """A socket that never drops or blocks on a full queue, and closes at once."""
    s = ctx.socket(kind)
    s.SNDHWM = s.RCVHWM = 0
    s.LINGER = 0
    return s


def run_node(spec: dict, shell=None):
    """Process entry point: run one relay node until terminated (a host
    relay: until its last engine is gone)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGABRT):  # a restarted node is forked from the
        signal.signal(sig, signal.SIG_DFL)  # running controller: drop its handlers
    logging.basicConfig(
        level=spec.get("log_level", logging.INFO),
        format="%(asctime)s.%(msecs).03d [%(name)s] %(message)s",
        datefmt="%H:%M:%S",
    )
    (shell or NodeShell)(spec).start()
