"""The relay on an engine host: one per host, started by the engines themselves.

An engine on a host other than the controller's (``BroadcastEngine.host_relay``)
makes sure its host runs a relay, joins it, and connects its broadcast
socket to it instead of to a controller-side leaf. So one copy of each
request crosses the host's link, one reply comes back per call, and the
engines' replies are checked on the host.

Who runs it: a lock file per (cluster, host). The engine that gets the lock
starts the relay and hands it the locked descriptor; every engine keeps a
thread blocked on the same lock, so when the relay dies one of them starts
another at once (the others stay blocked). The last engine out stops it: a
relay with no engine for ``GRACE`` seconds exits. A restarted relay finds its
engines in the host's join directory (one file per engine, with its pid).

The host is told apart by hostname, boot id and network namespace (``label``):
hosts of a test bed share a hostname and a filesystem. Engines reach the relay
on an abstract unix socket, which is private to the network namespace; with
CurveZMQ, its keys are derived from the session key, so no key file is needed.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import hmac
import json
import logging
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Optional

import zmq
from zmq.utils import z85

from . import protocol as P
from .schedulers.node import NodeShell, _socket, recv_frames, run_node
from .schedulers.routes import host_ident

log = logging.getLogger(__name__)
GRACE = 5.0  # seconds a relay with no engine waits for one before it exits
HOST_KEY = "ipb_host"  # in the engine connection file: the controller's host label
JOIN_TIMEOUT = 30.0
PROBE_INTERVAL = 0.05  # a restarted relay looks for its engines' reconnections this often


def host_label() -> str:
    """This host's name, with what tells it from a namesake: boot id and
    network namespace (the hosts of a ``NetBed`` share a hostname)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        netns = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        boot, netns = "", 0
    digest = hashlib.sha1(f"{boot}:{netns}".encode()).hexdigest()[:6]
    return f"{socket.gethostname()}-{digest}"


class Place:
    """Where a cluster's relay lives on this host: names, keys, files."""

    def __init__(self, key: bytes, label: str, curve: bool):
        self.label = label
        cluster = hashlib.sha256(b"ipyparallel-broadcast host\0" + key).hexdigest()[:12]
        self.name = f"ipb-{cluster}-{label}"
        self.down_url = f"ipc://@{self.name}"
        self.join_url = f"ipc://@{self.name}-join"
        base = os.path.join(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir(),
                            "ipyparallel-broadcast")
        os.makedirs(base, mode=0o700, exist_ok=True)
        self.lock_path = os.path.join(base, f"{self.name}.lock")
        self.leaf_path = os.path.join(base, f"{self.name}.leaf")
        self.joins = os.path.join(base, f"{self.name}.d")
        self.log_path = os.path.join(base, f"{self.name}.log")
        self.secret = self.public = None
        if curve:  # the local link's server keys: every engine of the cluster can derive them
            seed = hmac.new(key, b"host relay " + label.encode(), hashlib.sha256).digest()
            self.secret = z85.encode(seed)
            self.public = zmq.curve_public(self.secret)


class HostRelayShell(NodeShell):
    """A relay node serving the engines of its host (``RelayNode(host=...)``)."""

    def open_sockets(self, spec, curve):
        ctx = self.context
        place = self.place = Place(spec["key"].encode(), spec["host"], bool(curve["curve_serverkey"]))
        self.up = _socket(ctx, zmq.DEALER)
        self.up.IDENTITY = host_ident(spec["host"])
        if curve["curve_serverkey"]:  # to its leaf, as an engine connects: keys of its own
            public, secret = zmq.curve_keypair()
            self.up.curve_serverkey = curve["curve_serverkey"].encode()
            self.up.curve_publickey, self.up.curve_secretkey = public, secret
        self.up.connect(spec["up_url"])
        self.down = _socket(ctx, zmq.ROUTER)
        self.down.ROUTER_MANDATORY = 1
        self.down.ROUTER_HANDOVER = 1
        self.joins = _socket(ctx, zmq.ROUTER)
        for sock, url in ((self.down, place.down_url), (self.joins, place.join_url)):
            if place.secret:
                sock.curve_server, sock.curve_secretkey = True, place.secret
            sock.bind(url)
        self.notifications = self.registrar = self.monitor = None
        self.sockets = [self.up, self.down, self.joins]
        self.handlers = {self.up: self.node.on_up, self.down: self.node.on_down, self.joins: self.on_join}
        self.empty_since: Optional[float] = time.monotonic()
        # a restarted relay: its engines are here already, and reconnect by themselves;
        # each is announced once a probe shows it connected
        self.expected = {e["uuid"]: e for e in self.joined_engines()}
        self.next_probe: Optional[float] = time.monotonic() if self.expected else None

    def probe(self):
        """Announce the expected engines that are connected again (a send to
        one that is not fails at once: ROUTER_MANDATORY)."""
        for uuid, engine in list(self.expected.items()):
            try:
                self.down.send_multipart([uuid.encode(), P.PROBE], zmq.NOBLOCK)
            except zmq.ZMQError as e:
                if e.errno != zmq.EHOSTUNREACH:
                    raise
                if not _alive(engine["pid"]):
                    del self.expected[uuid]
                continue
            del self.expected[uuid]
            self.perform(self.node.on_join(engine["eid"], uuid))
        self.next_probe = time.monotonic() + PROBE_INTERVAL if self.expected else None

    def on_tick(self):
        if self.next_probe is not None and self.next_probe <= time.monotonic():
            self.probe()
        super().on_tick()

    def joined_engines(self):
        """The join files of engines that are still alive."""
        engines = []
        for name in os.listdir(self.place.joins) if os.path.isdir(self.place.joins) else ():
            try:
                with open(os.path.join(self.place.joins, name)) as f:
                    engine = json.load(f)
            except (OSError, ValueError):
                continue
            if isinstance(engine, dict) and _alive(engine.get("pid")):
                engines.append(engine)
        return engines

    def on_join(self, frames):
        idents, body = P.split_idents(frames)
        msg = self.codec.unpack(body)
        content = msg["content"]
        if msg["header"].get("msg_type") != P.JOIN or type(content.get("eid")) is not int \
                or not isinstance(content.get("uuid"), str):
            raise P.ProtocolError("expected ipb_join {eid, uuid}")
        return self.node.on_join(content["eid"], content["uuid"], who=list(idents))

    def on_joined(self, who):
        for idents in who:
            if idents:
                self.joins.send_multipart(idents + self.codec.pack(P.JOINED, dict(boot=self.node.boot)))

    def running(self) -> bool:
        if self.node.engines or self.expected:
            self.empty_since = None
        elif self.empty_since is None:
            self.empty_since = time.monotonic()
        elif time.monotonic() - self.empty_since > GRACE:
            self.log.info("%s: no engine left; exiting", self.node.name)
            return False
        return True

    def next_deadline(self):
        times = [t for t in (self.node.next_deadline(), self.next_probe) if t is not None]
        if self.empty_since is not None:
            times.append(self.empty_since + GRACE + 0.01)
        return min(times, default=None)


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (OSError, TypeError, ValueError):
        return False
    return True


def main():
    """``python -m ipyparallel_broadcast.hostrelay``: the spec (JSON) on stdin."""
    spec = json.load(sys.stdin)
    run_node(spec, shell=HostRelayShell)


class HostLink:
    """An engine's side: make sure the host's relay runs, join it, and start
    another if it dies while this engine lives."""

    def __init__(self, spec: dict, place: Place):
        self.spec, self.place = spec, place  # spec: the relay's, less its leaf
        os.makedirs(place.joins, mode=0o700, exist_ok=True)
        self.stopped = threading.Event()

    def leaf_index(self, proposed: int) -> int:
        """The leaf this host's relay hangs under: the first engine's choice, kept."""
        fd = os.open(self.place.leaf_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            known = os.read(fd, 32)
            if known.strip():
                return int(known)
            os.write(fd, str(proposed).encode())
            return proposed
        finally:
            os.close(fd)

    def ensure_relay(self, block: bool = False) -> bool:
        """Start the relay if nobody holds the host's lock (``block``: wait
        until the running relay dies first). True if this call started one."""
        fd = os.open(self.place.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EAGAIN, errno.EACCES):
                return False
            raise
        try:
            spec = dict(self.spec, lock_fd=fd)
            with open(self.place.log_path, "ab") as out:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "ipyparallel_broadcast.hostrelay"], stdin=subprocess.PIPE,
                    stdout=out, stderr=subprocess.STDOUT, pass_fds=(fd,), start_new_session=True)
            proc.stdin.write(json.dumps(spec).encode())
            proc.stdin.close()
            log.info("started the host relay of %s (pid %s)", self.place.label, proc.pid)
            return True
        finally:
            os.close(fd)  # the relay holds the lock through its copy

    def join(self, eid: int, uuid: str, session, timeout: float = JOIN_TIMEOUT):
        """Join the host's relay (starting it if need be); return once the
        whole tree routes to this engine. Then watch the relay."""
        with open(os.path.join(self.place.joins, uuid), "w") as f:
            json.dump(dict(eid=eid, uuid=uuid, pid=os.getpid()), f)
        ctx = zmq.Context.instance()
        codec = P.Codec(session)
        deadline = time.monotonic() + timeout
        while True:
            self.ensure_relay()
            sock = ctx.socket(zmq.DEALER)
            sock.LINGER = 0
            if self.place.public:
                public, secret = zmq.curve_keypair()
                sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = self.place.public, public, secret
            sock.connect(self.place.join_url)
            try:
                sock.send_multipart(codec.pack(P.JOIN, dict(eid=eid, uuid=uuid)))
                if sock.poll(1000):
                    msg = codec.unpack(P.split_idents(recv_frames(sock))[1])
                    if msg["header"].get("msg_type") == P.JOINED:
                        break
            finally:
                sock.close()
            if time.monotonic() > deadline:
                raise TimeoutError(f"the host relay of {self.place.label} did not take engine {eid} "
                                   f"in {timeout:g} s; see {self.place.log_path}")
        threading.Thread(target=self._watch, daemon=True, name="host-relay-watch").start()

    def _watch(self):
        while not self.stopped.is_set():  # blocks while a relay holds the lock
            try:
                self.ensure_relay(block=True)
            except OSError:
                log.exception("could not restart the host relay")
                self.stopped.wait(1.0)

    def leave(self, uuid: str):
        self.stopped.set()
        try:
            os.unlink(os.path.join(self.place.joins, uuid))
        except OSError:
            pass


if __name__ == "__main__":
    main()
