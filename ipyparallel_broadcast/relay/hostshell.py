"""The relay on an engine host: one per host, started by the engines themselves.

An engine on a host other than the controller's (``BroadcastEngine.host_relay``)
makes sure its host runs a relay, joins it, and connects its broadcast
socket to it instead of to a controller-side leaf (its side: ``hostlink``). So one copy of each
request crosses the host's link, one reply comes back per call, and the
engines' replies are checked on the host.

Who runs it: a lock file per (cluster, host). The engine that gets the lock
starts the relay and hands it the locked descriptor; every engine keeps a
thread blocked on the same lock, so when the relay dies one of them starts
another at once (the others stay blocked). The last engine out stops it: a
relay with no engine for ``GRACE`` seconds exits (engines still registering
through it count: their answers would go with it). A restarted relay finds its
engines in the host's join directory (one file per engine, with its pid).

The host is told apart by hostname, boot id and network namespace (``label``):
hosts of a test bed share a hostname and a filesystem. Engines reach the relay
on an abstract unix socket, which is private to the network namespace; with
CurveZMQ, its keys are derived from the session key, so no key file is needed.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from functools import partial

import zmq

from ..host import claim as claims
from ..host import composedir
from ..host.link import Place
from ..host.shm import pid_alive
from ..wire import protocol as P
from ..wire.frames import send_frames
from ..wire.topology import host_ident
from .dataplane.chunks import BULK
from .events import UP, Send
from .forwarding import outbound
from .hubside import HubSide
from .joinbatch import JoinBatch
from .shell import NodeShell, _socket, run_node

GRACE = 5.0  # seconds a relay with no engine waits for one before it exits (spec "grace")
PROBE_INTERVAL = 0.05  # a restarted relay looks for its engines' reconnections this often


class HostRelayShell(NodeShell):
    """A relay node serving the engines of its host (``RelayNode(host=...)``)."""

    def facts(self) -> dict:
        """This process's facts, its registrations and hearts too (``HubSide``, made as its sockets open)."""
        return {**super().facts(), **(self.hub_side.stats() if getattr(self, "hub_side", None) else {})}

    def open_sockets(self, spec, curve):
        ctx = self.context
        place = self.place = Place(spec["key"].encode(), spec["host"], bool(curve["curve_serverkey"]))
        self.up = _socket(ctx, zmq.DEALER)
        self.up.IDENTITY = host_ident(spec["host"])
        self.curve_serverkey = curve["curve_serverkey"].encode() if curve["curve_serverkey"] else None
        if self.curve_serverkey:  # to its leaf, as an engine connects: keys of its own
            public, secret = zmq.curve_keypair()
            self.up.curve_serverkey = self.curve_serverkey
            self.up.curve_publickey, self.up.curve_secretkey = public, secret
        self.up.connect(spec["up_url"])
        self.down = _socket(ctx, zmq.ROUTER)
        self.down.ROUTER_MANDATORY = 1
        self.down.ROUTER_HANDOVER = 1
        self.joins = _socket(ctx, zmq.ROUTER)
        self.bulk = _socket(ctx, zmq.ROUTER)  # chunks of big requests, from the host that feeds this one
        for sock in (self.down, self.joins, self.bulk) if place.secret else ():
            sock.curve_server, sock.curve_secretkey = True, place.secret
        for sock, url in ((self.down, place.down_url), (self.joins, place.join_url)):
            sock.bind(url)
        ip = spec.get("ip") or local_ip_towards(spec["up_url"])  # BroadcastEngine.host_relay_ip
        low, high = spec.get("ports") or (49152, 65535)  # BroadcastEngine.host_relay_ports
        port = self.bulk.bind_to_random_port(f"tcp://{ip}", low, high + 1, max_tries=max(100, high + 1 - low))
        self.node.heartbeats.links(bulk_url=f"tcp://{ip}:{port}")
        self.notifications = self.registrar = self.monitor = self.pulse = None
        self.pulse_url = None  # where the parent's pulse link is, once connected
        self.sockets = [self.up, self.down, self.joins, self.bulk]
        self.handlers = {
            self.up: self.node.on_up,
            self.down: self.node.on_down,
            self.joins: self.on_join,
            self.bulk: self.node.on_chunk,
        }
        self.hub_side = None
        if spec.get("registration_url"):  # engines register and beat through this relay, by host
            self.hub_side = HubSide(spec, place, self.codec, ctx, _socket, self.engine_alive, self.engines_silent)
            self.sockets += self.hub_side.sockets
            for sock, handler in self.hub_side.handlers.items():
                self.handlers[sock] = partial(self.hub_side.handle, handler)
        self.own_process: dict = {}  # uuid -> whether the engine is a process of its own (its pid)
        self.joining = JoinBatch()  # engines joined, not yet announced to the leaf
        self.grace = float(spec.get("grace", GRACE))
        self.empty_since: float | None = time.monotonic()
        # a restarted relay: its engines are here already, and reconnect by themselves;
        # each is announced once a probe shows it connected
        self.died_before: list[str] = []  # engines that died while no relay ran: the hub is told
        self.expected = {e["uuid"]: e for e in self.joined_engines(self.died_before)}
        self.next_probe: float | None = time.monotonic() if self.expected else None
        self.pids: dict = {}  # uuid -> the pid of the engine's process
        self.next_check = time.monotonic() + self.grace

    def engine_alive(self, uuid: str) -> bool | None:
        """Whether an engine's process runs (None: the relay cannot tell)."""
        pid = self.pids.get(uuid)
        return pid_alive(pid) if pid is not None and self.own_process.get(uuid, True) else None

    def engines_silent(self, uuids):
        """Engines whose heart stopped (``enginehearts``): lost."""
        for uuid in uuids:
            self.pids.pop(uuid, None)
            self.perform(self.node.on_engine_lost(uuid, P.DIED))

    def probe(self):
        """Announce the expected engines that are connected again (a send to
        one that is not fails at once: ROUTER_MANDATORY)."""
        back = []
        for uuid, engine in list(self.expected.items()):
            try:
                self.down.send_multipart([uuid.encode(), P.PROBE], zmq.NOBLOCK)
            except zmq.ZMQError as e:
                if e.errno != zmq.EHOSTUNREACH:
                    raise
                if not pid_alive(engine["pid"]):
                    del self.expected[uuid]
                continue
            del self.expected[uuid]
            self.pids[uuid] = engine.get("pid")
            self.own_process[uuid] = engine.get("process", True) is not False
            back.append((engine["eid"], uuid, None, engine.get("shm")))
        if back:
            self.perform(self.node.on_join(back))
        self.next_probe = time.monotonic() + PROBE_INTERVAL if self.expected else None

    def on_tick(self):
        now = time.monotonic()
        if self.next_probe is not None and self.next_probe <= now:
            self.probe()
        if self.next_check <= now:
            self.check_engines()
        if self.hub_side is not None:
            self.perform(self.hub_side.on_tick())
        super().on_tick()

    def check_engines(self):
        """Engines whose process is gone are lost, even if nobody tells us
        (the controller may be gone too): the last one out stops the relay."""
        self.next_check = time.monotonic() + self.grace
        for uuid, pid in list(self.pids.items()):
            if pid is not None and not pid_alive(pid):
                del self.pids[uuid]
                self.perform(self.node.on_engine_lost(uuid, P.DIED))
                if self.hub_side is not None:  # the hub unregisters it now
                    self.perform(self.hub_side.engines_lost([uuid]))

    def joined_engines(self, dead: list | None = None):
        """The join files of engines that are still alive (``dead``: the
        uuids of those whose process is gone, their files removed)."""
        engines = []
        for name in os.listdir(self.place.joins) if os.path.isdir(self.place.joins) else ():
            if name.endswith(".new"):
                continue  # being written
            try:
                with open(os.path.join(self.place.joins, name)) as f:
                    engine = json.load(f)
            except (OSError, ValueError):
                continue
            if isinstance(engine, dict) and pid_alive(engine.get("pid")):
                engines.append(engine)
            elif dead is not None and isinstance(engine, dict) and isinstance(engine.get("uuid"), str):
                dead.append(engine["uuid"])
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.place.joins, name))
        return engines

    def on_join(self, frames):
        idents, body = P.split_idents(frames)
        msg = self.codec.unpack(body)
        content = msg["content"]
        if (
            msg["header"].get("msg_type") != P.JOIN
            or type(content.get("eid")) is not int
            or not isinstance(content.get("uuid"), str)
        ):
            raise P.ProtocolError("expected ipb_join {eid, uuid, pid}")
        pid = content.get("pid")
        self.pids[content["uuid"]] = pid if type(pid) is int else None
        self.own_process[content["uuid"]] = content.get("process", True) is not False
        self.joining.add((content["eid"], content["uuid"], list(idents), content.get("shm")), time.monotonic())
        if self.hub_side is not None:
            self.hub_side.joined([content["uuid"]])
        return []

    def drained(self):
        """The engines that joined, announced to the leaf in one message (``JoinBatch``)."""
        joining = self.joining.take(time.monotonic(), self.hub_side is not None and self.hub_side.registering())
        return (self.node.on_join(joining) if joining else []) + super().drained()

    def perform(self, sends):
        if self.hub_side is not None:
            sends = self.hub_side.perform(sends)
        super().perform(sends)
        if self.node.heartbeats.parent_pulse is not None:
            self.follow_pulse(self.node.heartbeats.parent_pulse)

    def send_up(self, frames):
        """To the leaf; outcomes of a call passed on go back the way it came (``forwarding.outbound``)."""
        send = outbound(Send(UP, frames))
        if send.socket == BULK:
            self.send_bulk(send.frames)
        else:
            send_frames(self.up, frames)

    def follow_pulse(self, port: int):
        """Connect (again, if the parent moved) to the parent's pulse link
        (see ``relay.children``): pings and pongs beside the bulk data."""
        url = f"{self.spec['up_url'].rsplit(':', 1)[0]}:{port}"
        if url == self.pulse_url or self.loop is None:
            return
        if self.pulse is not None:
            self.loop.unregister(self.pulse)
            del self.handlers[self.pulse]
            self.pulse.close()
        self.pulse = _socket(self.context, zmq.DEALER)
        self.pulse.IDENTITY = self.up.IDENTITY
        if self.curve_serverkey:  # as the data link: the leaf's key, keys of its own
            public, secret = zmq.curve_keypair()
            self.pulse.curve_serverkey = self.curve_serverkey
            self.pulse.curve_publickey, self.pulse.curve_secretkey = public, secret
        self.pulse.connect(url)
        self.pulse_url = url
        self.handlers[self.pulse] = self.node.on_parent_pulse
        self.loop.register(self, self.pulse)
        self.log.info("%s: pings and pongs also on %s", self.node.name, url)

    def send_pulse(self, frames):
        self.follow_pulse(self.node.heartbeats.parent_pulse)
        if self.pulse is not None:
            send_frames(self.pulse, frames)

    def on_joined(self, who):
        for idents in who:
            if idents:
                self.joins.send_multipart(idents + self.codec.pack(P.JOINED, dict(boot=self.node.boot)))

    def begin(self):
        if self.hub_side is not None:  # where the hub finds this relay (one restarted: anew)
            self.perform(self.hub_side.registrar.hello())
            self.perform(self.hub_side.engines_lost(self.died_before))  # (after the hello's answer)
        super().begin()

    def finish(self):
        """The last one out: the host's files for this cluster go too (a relay
        started later makes them again; two cannot run: the socket is taken).
        An engine that joined while this relay was leaving keeps its join file
        (the relay it starts next, and any restarted after, find it there) and
        the lock its engines wait on. The engines' compose directory goes if no
        engine is in it."""
        if self.joined_engines():
            return
        self.place.remove_files()
        # engines killed before their exit handlers ran (an MPI launcher's SIGKILL) left it
        composedir.remove_if_unused(composedir.cluster_key(self.spec["key"].encode()))

    def running(self) -> bool:
        registering = self.joining or (self.hub_side is not None and self.hub_side.registering())
        if self.node.engines or self.expected or registering:
            self.empty_since = None
        elif self.empty_since is None:
            self.empty_since = time.monotonic()
        elif time.monotonic() - self.empty_since > self.grace:
            if claims.leave(self.place.claim_path) is None:  # engines on their way: wait for them
                self.log.info("%s: no engine yet, but engines claim the host; waiting", self.node.name)
                self.empty_since = time.monotonic()
                return True
            self.log.info("%s: no engine left; exiting", self.node.name)
            return False
        return True

    def next_deadline(self):
        registrations = self.hub_side.next_deadline() if self.hub_side is not None else None
        times = [t for t in (super().next_deadline(), self.next_probe, self.next_check, registrations) if t]
        times += [self.joining.due] if self.joining else []
        if self.empty_since is not None:
            times.append(self.empty_since + self.grace + 0.01)
        return min(times, default=None)


def local_ip_towards(url: str) -> str:
    """The address of this host's interface that reaches ``url`` (tcp://ip:port):
    where the hosts that feed this one reach it too."""
    import socket

    host, port = url[len("tcp://") :].rsplit(":", 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, int(port)))  # no packet is sent: the kernel only picks a route
        return s.getsockname()[0]


def keep_priority() -> int:
    """Run the whole scheduling group at this process's nice; return it.

    A relay runs in a session of its own (it outlives the engine that started
    it). Where the kernel groups sessions for scheduling (Linux's autogroup, on
    by default), a new session is a new group at the default weight: a relay
    started by an engine under ``nice`` took as much of the host as all other
    sessions together. On two cores, 64 such relays left a controller
    a sixtieth of the machine."""
    nice = os.nice(0)
    if nice > 0:
        with contextlib.suppress(OSError):  # no autogroup here: the process's nice is all there is
            with open("/proc/self/autogroup", "w") as f:
                f.write(str(nice))
    return nice


def main():
    """``python -m ipyparallel_broadcast.relay.hostshell``: the spec (JSON) on stdin."""
    spec = json.load(sys.stdin)
    keep_priority()
    run_node(spec, shell=HostRelayShell)


if __name__ == "__main__":
    main()
