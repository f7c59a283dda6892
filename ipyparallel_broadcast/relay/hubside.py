"""A host relay's links to the hub, beside the tree: registration and
heartbeats by host (``registrar``, ``enginehearts``), and their sockets.

  register   ROUTER (abstract unix socket): its engines' registration requests
  registrar  DEALER to the hub's registration socket: a batch at a time (a
             hello each time it connects again: a hub restarted)
  ping_in    SUB to the heart monitor's pings; pong_out, a DEALER whose
             identity is the relay's heart, answers them for the host
  ping_out   PUB (abstract unix socket): the pings, passed on to the engines
  pong_in    ROUTER (abstract unix socket): the engines' hearts answer here

The parts are sans-I/O; this class only moves their frames, and asks the
host relay's shell (``hostshell``) about its engines' processes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import zmq

from ..host.link import Place
from ..wire import protocol as P
from ..wire.frames import send_frames
from ..wire.topology import host_ident
from .enginehearts import ENGINE_PING, HUB_PONG, PAUSE_LIMIT, EngineHearts
from .events import Send
from .registrar import ENGINES, HUB, Registrar

log = logging.getLogger(__name__)
OURS = (ENGINES, HUB, HUB_PONG, ENGINE_PING)


class HubSide:
    """Registration and heartbeats of one host's engines, by host."""

    def __init__(
        self,
        spec: dict,
        place: Place,
        codec: P.Codec,
        ctx: zmq.Context,
        make_socket: Callable,
        alive: Callable[[str], bool | None],
        lost: Callable[[list[str]], None],
    ):
        """``alive(uuid)``: whether an engine's process runs (None: cannot tell);
        ``lost(uuids)``: engines given up (the shell fails what they owe)."""
        self.registrar = Registrar(codec, spec["host"])
        self.hearts = EngineHearts(pause_limit=float(spec.get("pause_limit") or PAUSE_LIMIT))
        self.alive, self.lost = alive, lost
        curve = spec.get("curve_serverkey")
        self.register = self._bound(make_socket(ctx, zmq.ROUTER), place.register_url, place)
        self.ping_out = self._bound(make_socket(ctx, zmq.PUB), place.ping_url, place)
        self.pong_in = self._bound(make_socket(ctx, zmq.ROUTER), place.pong_url, place)
        self.registrar_sock = self._connected(make_socket(ctx, zmq.DEALER), spec["registration_url"], curve)
        self.ping_in = make_socket(ctx, zmq.SUB)
        self.ping_in.SUBSCRIBE = b""
        self._connected(self.ping_in, spec["hb_ping_url"], curve)
        self.pong_out = make_socket(ctx, zmq.DEALER)
        self.pong_out.IDENTITY = host_ident(spec["host"])  # the relay's heart, as the hub knows it
        self._connected(self.pong_out, spec["hb_pong_url"], curve)
        # the hub restarted: say where this relay is (the hub routes its notices by what it heard)
        self.registrar_events = self.registrar_sock.get_monitor_socket(zmq.EVENT_CONNECTED)
        self.registrar_events.linger = 0
        self.hub_links = 0
        self.handlers = {
            self.register: self.registrar.from_engine,
            self.registrar_sock: self.registrar.from_hub,
            self.registrar_events: self.on_hub_link,
            self.ping_in: self.on_hub_ping,
            self.pong_in: self.on_pong,
        }
        self.sockets = list(self.handlers)

    @staticmethod
    def _bound(sock, url: str, place: Place):
        if place.secret:
            sock.curve_server, sock.curve_secretkey = True, place.secret
        sock.bind(url)
        return sock

    @staticmethod
    def _connected(sock, url: str, curve_serverkey):
        if curve_serverkey:  # the hub's key, keys of its own
            public, secret = zmq.curve_keypair()
            sock.curve_serverkey = curve_serverkey.encode()
            sock.curve_publickey, sock.curve_secretkey = public, secret
        sock.connect(url)
        return sock

    # ---------------------------------------------------------------- events
    def on_hub_ping(self, frames) -> list[Send]:
        sends = self.hearts.hub_ping(frames)
        gone = self.hearts.silent(self.alive)
        if gone:
            log.warning("engines %s stopped answering: dead, or paused too long", ", ".join(gone))
            self.lost(gone)
            sends += self.registrar.lost(gone)
        return sends

    def on_hub_link(self, frames) -> list[Send]:
        """The link to the hub's registration socket connected: again, after the
        first, is a hub restarted (or the link back), which hears a hello."""
        self.hub_links += 1
        return self.registrar.hello() if self.hub_links > 1 else []

    def on_pong(self, frames) -> list[Send]:
        self.hearts.pong(frames)
        first = self.hearts.take_first()
        return self.registrar.beating(first) if first else []

    def engines_lost(self, uuids) -> list[Send]:
        """Engines the relay found gone otherwise (their process ended)."""
        for uuid in uuids:
            self.hearts.forget(uuid)
        return self.registrar.lost(uuids)

    def joined(self, uuids) -> None:
        self.registrar.joined(uuids)

    def registering(self) -> bool:
        """Engines of this host are registering (``Registrar.registering``)."""
        return self.registrar.registering()

    def handle(self, handler, frames) -> list[Send]:
        try:
            return handler(frames)
        except P.ProtocolError as e:
            log.warning("a registration or heartbeat message dropped: %s", e)
            return []

    # ----------------------------------------------------------------- sends
    def perform(self, sends: list[Send]) -> list[Send]:
        """Send ours; return the others, for the shell."""
        rest = []
        for send in sends:
            if send.socket == HUB:
                send_frames(self.registrar_sock, send.frames)
            elif send.socket == HUB_PONG:
                send_frames(self.pong_out, send.frames)
            elif send.socket == ENGINE_PING:
                send_frames(self.ping_out, send.frames)
            elif send.socket == ENGINES:
                try:  # an engine that left meanwhile: nothing to answer
                    self.register.send_multipart(send.frames, zmq.NOBLOCK)
                except zmq.ZMQError as e:
                    log.info("an engine left before its registration's answer: %s", e)
            else:
                rest.append(send)
        return rest

    def next_deadline(self) -> float | None:
        return self.registrar.next_deadline()

    def on_tick(self) -> list[Send]:
        return self.registrar.on_tick()

    def stats(self) -> dict:
        return {**self.registrar.stats(), **self.hearts.stats()}
