"""An engine's side of its host's relay (see ``relay.hostshell``): where the relay
lives, its keys, starting it, joining it, and starting another if it dies.

Kept apart from ``relay.hostshell`` so that an engine imports no more than it needs
before its compose mode has set thread limits (nothing here loads NumPy).
"""

from __future__ import annotations

import contextlib
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

import zmq
from zmq.utils import z85

from ..wire import protocol as P
from . import claim as claims

log = logging.getLogger(__name__)
HOST_KEY = "ipb_host"  # in the engine connection file: the controller's host label
JOIN_TIMEOUT = 30.0
MAX_JOIN_WAIT = 8.0  # seconds: the longest an engine waits for its relay's answer before it asks again


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

    @staticmethod
    def base() -> str:
        return os.path.join(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir(), "ipyparallel-broadcast")

    @staticmethod
    def prefix(key: bytes) -> str:
        """What every name of this cluster's relays starts with."""
        return f"ipb-{hashlib.sha256(b'ipyparallel-broadcast host' + bytes(1) + key).hexdigest()[:12]}-"

    def __init__(self, key: bytes, label: str, curve: bool):
        self.label = label
        self.name = f"{self.prefix(key)}{label}"
        self.down_url = f"ipc://@{self.name}"
        self.join_url = f"ipc://@{self.name}-join"
        self.register_url = f"ipc://@{self.name}-register"  # engines register here (``relay.registrar``)
        self.ping_url = f"ipc://@{self.name}-ping"  # the hub's pings, passed on (``relay.enginehearts``)
        self.pong_url = f"ipc://@{self.name}-pong"  # ... and the engines' hearts' answers
        base = self.base()
        os.makedirs(base, mode=0o700, exist_ok=True)
        self.lock_path = os.path.join(base, f"{self.name}.lock")
        self.claim_path = os.path.join(base, f"{self.name}.claim")  # ``host.claim``
        self.leaf_path = os.path.join(base, f"{self.name}.leaf")
        self.joins = os.path.join(base, f"{self.name}.d")
        self.log_path = os.path.join(base, f"{self.name}.log")
        self.secret = self.public = None
        if curve:  # the local link's server keys: every engine of the cluster can derive them
            seed = hmac.new(key, b"host relay " + label.encode(), hashlib.sha256).digest()
            self.secret = z85.encode(seed)
            self.public = zmq.curve_public(self.secret)

    def remove_files(self):
        """The host's files for this cluster: join files, lock, claim, leaf, log."""
        for name in os.listdir(self.joins) if os.path.isdir(self.joins) else ():
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.joins, name))
        for path in (self.leaf_path, self.log_path, self.lock_path, self.claim_path):
            with contextlib.suppress(OSError):
                os.unlink(path)
        with contextlib.suppress(OSError):
            os.rmdir(self.joins)


class HostLink:
    """An engine's side: make sure the host's relay runs, join it, and start
    another if it dies while this engine lives."""

    def __init__(self, spec: dict, place: Place):
        self.spec, self.place = spec, place  # spec: the relay's, less its leaf
        os.makedirs(place.joins, mode=0o700, exist_ok=True)
        self.stopped = threading.Event()
        self.watching = False
        self.claim_fd: int | None = None

    def claim(self):
        """Until ``release``, the host's relay waits for this process's engines
        (``host.claim``): call before ``ensure_relay`` and registration."""
        if self.claim_fd is None:
            self.claim_fd = claims.claim(self.place.claim_path, JOIN_TIMEOUT)

    def release(self):
        """This process's engines have joined (or it gives up): the claim goes."""
        claims.release(self.claim_fd)
        self.claim_fd = None

    @classmethod
    def from_connection(
        cls, info: dict, session, label: str, curve_serverkey=None, log_level=30, ip: str = "", ports=None
    ) -> HostLink:
        """The link of an engine whose engine connection file is ``info``."""
        from ..wire.naming import TREE_KEY

        place = Place(session.key, label, curve=bool(curve_serverkey))
        link = cls(
            dict(
                key=session.key.decode(),
                signature_scheme=session.signature_scheme,
                packer=session.packer,
                unpacker=session.unpacker,
                host=label,
                depth=info[TREE_KEY]["depth"],
                fanout=info[TREE_KEY]["fanout"],
                shm=info[TREE_KEY].get("shm", True),
                shm_threshold=info[TREE_KEY].get("shm_threshold"),
                down_url=place.down_url,
                # the hub's: its engines register and beat through the relay (none: each by itself)
                registration_url=f"{info['interface']}:{info['registration']}" if "registration" in info else None,
                hb_ping_url=f"{info['interface']}:{info['hb_ping']}" if "hb_ping" in info else None,
                hb_pong_url=f"{info['interface']}:{info['hb_pong']}" if "hb_pong" in info else None,
                log_level=log_level,
                ip=ip,
                ports=list(ports) if ports else None,  # (BroadcastEngine.host_relay_ports)
                curve_serverkey=curve_serverkey.decode() if curve_serverkey else None,
                # the controller's timing and data plane (a controller before these: the defaults)
                **{
                    k: info[TREE_KEY][k]
                    for k in ("ping_interval", "node_timeout", "bulk", "pause_limit")
                    if k in info[TREE_KEY]
                },
            ),
            place,
        )
        link.leaves = [f"{info['interface']}:{port}" for port in info["broadcast"]]
        return link

    def attach(self):
        """Place the relay under its leaf: the first leaf of the tree, for
        every host. One process of the controller host then plans the data
        plane of all hosts, in both directions (a push's chunks, a reduce's
        chain): each big value crosses the controller host's link once,
        whatever the tree's depth and fan-out (one chain per leaf crossed it
        once per leaf). What the host relays spare the leaves (each host's
        engines in one bundle) leaves one leaf enough for them all."""
        from ..wire.topology import TreeShape

        index = self.leaf_index(0)
        path = TreeShape(self.spec["depth"], self.spec["fanout"]).leaf_path(index)
        self.spec.update(path=list(path), up_url=self.leaves[index])

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
        fd = self.take_lock(block)
        if fd is None:
            return False
        try:
            spec = dict(self.spec, lock_fd=fd)
            with open(self.place.log_path, "ab") as out:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "ipyparallel_broadcast.relay.hostshell"],
                    stdin=subprocess.PIPE,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    pass_fds=(fd,),
                    start_new_session=True,
                )
            proc.stdin.write(json.dumps(spec).encode())
            proc.stdin.close()
            log.info("started the host relay of %s (pid %s)", self.place.label, proc.pid)
            return True
        finally:
            os.close(fd)  # the relay holds the lock through its copy

    def take_lock(self, block: bool = False) -> int | None:
        """The host's relay lock, as a descriptor (None: another holds it).
        Whoever holds it runs the relay, for as long as the descriptor is open."""
        fd = os.open(self.place.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EAGAIN, errno.EACCES):
                return None
            raise
        return fd

    def join(self, eid: int, uuid: str, session, timeout: float = JOIN_TIMEOUT, maps: bool = True, watch: bool = True):
        """Join the host's relay (starting it if need be); return once the
        whole tree routes to this engine. Then watch the relay (``watch``; not
        when the caller runs the relay itself). ``maps``: the engine is a
        process of its own, which can map the relay's shared memory (a
        simulated engine is neither: its silence is its death)."""
        from .shm import identity

        me = dict(eid=eid, uuid=uuid, pid=os.getpid(), shm=identity() if maps else None, process=maps)
        codec = P.Codec(session)
        deadline = time.monotonic() + timeout
        sock = self._join_socket()
        try:
            # one socket throughout: an answer to any try is heard. Tries back off,
            # so a relay slow to answer (a loaded host) is not flooded with joins
            wait = 1.0
            while True:
                self._write_join_file(me)  # each try: where every relay started later finds this engine
                self.ensure_relay()
                sock.send_multipart(codec.pack(P.JOIN, me))
                if self._joined(sock, codec, min(time.monotonic() + wait, deadline)):
                    break
                if time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"the host relay of {self.place.label} did not take engine {eid} "
                        f"in {timeout:g} s; see {self.place.log_path}"
                    )
                wait = min(2 * wait, MAX_JOIN_WAIT)
        finally:
            sock.close()
        if watch and not self.watching:
            self.watching = True
            threading.Thread(target=self._watch, daemon=True, name="host-relay-watch").start()

    def _join_socket(self) -> zmq.Socket:
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.LINGER = 0
        if self.place.public:
            public, secret = zmq.curve_keypair()
            sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = self.place.public, public, secret
        sock.connect(self.place.join_url)
        return sock

    @staticmethod
    def _joined(sock: zmq.Socket, codec: P.Codec, until: float) -> bool:
        """Whether the relay's ``ipb_joined`` came before ``until``."""
        while (left := until - time.monotonic()) > 0:
            if not sock.poll(int(1000 * left) + 1):
                return False
            msg = codec.unpack(P.split_idents(sock.recv_multipart())[1])
            if msg["header"].get("msg_type") == P.JOINED:
                return True
        return False

    def _write_join_file(self, me: dict):
        os.makedirs(self.place.joins, mode=0o700, exist_ok=True)
        path = os.path.join(self.place.joins, me["uuid"])
        with open(path + ".new", "w") as f:
            json.dump(me, f)
        os.replace(path + ".new", path)  # a relay reading it sees all of it or nothing

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


def port_range(text: str) -> tuple[int, int] | None:
    """``"low-high"`` (``BroadcastEngine.host_relay_ports``) as ``(low, high)``,
    both included; None for ``""`` (any port). Raises ``ValueError``."""
    if not text:
        return None
    low, sep, high = text.partition("-")
    try:
        span = (int(low), int(high)) if sep else None
    except ValueError:
        span = None
    if span is None or not 1 <= span[0] <= span[1] <= 65535:
        raise ValueError(f"a port range is 'low-high', 1 to 65535, not {text!r}")
    return span
