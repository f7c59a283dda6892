"""``SimEngines``: many simulated engines in a few processes, for scale this
machine cannot hold with real ones (a real engine costs ~100 MB and 0.4 s).

Each simulated engine does what an engine does on the wire, and no more:
- it registers with the hub through the real registration protocol (behind
  a simulated host, through that host's relay, by host, as a real engine
  there does) and answers the heart monitor's pings, so the hub counts it
  like any engine;
- it connects one shell socket (identity: its uuid) to the mux and to its
  broadcast leaf (``id % leaves``, as real engines choose);
- it answers ``apply_request`` and ``execute_request`` with correctly signed
  replies (``reply_bytes`` of result, after ``delay`` seconds; a reduce's
  apply, the number 1, as ``engine_value`` gives it), and publishes
  the IOPub ``idle`` status clients wait for, except where our BroadcastView
  asks for outputs in the reply (as our engines do, see ``kernel``);
- ``execute_request`` runs its code (``exec``, in a namespace per engine that
  holds ``engine_id``): what it prints goes out as an IOPub ``stream``, what
  it raises as an error reply, as a kernel's would.
With ``hosts=True`` each process is a host of its own: it runs a host relay
(``relay.hostshell``; labelled ``<host>-sim<k>``, so that processes on one machine are
told apart) and its engines reach the tree through it, as real engines on
another host do. With ``hosts_per_process`` above one, each process is that
many hosts, and runs their relays itself: the real host relay code (each its
own ``HostRelayShell``, node and sockets) on one event loop (``relay.loop``),
so that a thousand hosts fit on this machine. ``mux=False``: engines do not
connect to the hub's mux (a hundred thousand TCP connections to one
process); only the tree reaches them. The task queue and control channel are not connected (no load
balancing, abort or shutdown of simulated engines). ``kill(eid)`` makes one engine fall
silent: it stops answering and beating, so the hub declares it dead.

    python -m ipyparallel_broadcast.tools.sim ENGINE_CONNECTION_FILE --engines 1024
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import heapq
import json
import logging
import multiprocessing
import os
import queue
import resource
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from itertools import count as counter

import zmq
import zmq.asyncio
from jupyter_client.session import Session

from ..host.link import Place, host_label
from ..wire import protocol as P
from ..wire.frames import recv_frames, send_frames
from .simanswers import EngineAnswers, SimEngineState

log = logging.getLogger(__name__)


def session_from(info: dict) -> Session:
    return Session(
        key=info["key"].encode(),
        signature_scheme=info.get("signature_scheme", "hmac-sha256"),
        packer=info.get("pack", "json"),
        unpacker=info.get("unpack", "json"),
    )


JOINS_AT_ONCE = 128  # threads of a farm process that join engines to their relays
FARM_GRACE = 3600.0  # seconds a farm's in-process relay with no engine waits before it exits


class SimEngine(SimEngineState):
    """One simulated engine's sockets and state."""

    def __init__(self, ctx: zmq.Context):
        super().__init__()
        self.host = 0  # which of its process's hosts it is on
        self.shell = ctx.socket(zmq.ROUTER)  # used by the serving thread, once registered
        self.heart = ctx.socket(zmq.DEALER)  # used by the heartbeat thread
        for s in (self.shell, self.heart):
            s.IDENTITY = self.ident
            s.LINGER = 0
        self.shell.SNDHWM = self.shell.RCVHWM = 0


class SimProcess:
    """K simulated engines in one process: registered on asyncio, served by one thread (``Server``)."""

    def __init__(
        self,
        info: dict,
        count: int,
        reply_bytes: int = 0,
        delay: float = 0.0,
        hosts: list[str] = (),
        mux: bool = True,
    ):
        """``hosts``: the labels of the hosts this process is (none: engines
        reach the tree's leaves directly); its engines are spread over them.
        One host: its relay is started as a real engine starts it (a process of
        its own). More: this process runs their relays (``run_relays``)."""
        self.info, self.count, self.delay, self.mux = info, count, delay, mux
        self.session = session_from(info)
        self.links = []
        if hosts:  # this process is hosts: its engines are behind their relays
            from ..host.link import HostLink

            self.links = [HostLink.from_connection(info, self.session, label) for label in hosts]
        self.relays_here = len(self.links) > 1
        # joins wait for the tree's answer: as many at once as a host's engines would (its relay batches them)
        self.joins = ThreadPoolExecutor(max_workers=max(1, min(count, JOINS_AT_ONCE)), thread_name_prefix="join")
        self.ctx = zmq.asyncio.Context()  # registration
        self.ctx.MAX_SOCKETS = 2 * count + 64
        self.sync_ctx = zmq.Context()  # shells (one serving thread) and hearts (their own thread)
        self.sync_ctx.MAX_SOCKETS = 2 * count + 64
        self.dead: list[SimEngine] = []  # killed: their hearts are closed by the heartbeat thread
        self.engines: dict[int, SimEngine] = {}
        self.hearts: list[list[SimEngine]] = [[] for _ in self.links or [None]]  # engines by host, for pings
        self.answers = EngineAnswers(self.session, reply_bytes)
        self.server = Server(self)

    def url(self, port) -> str:
        return port if "://" in str(port) else f"{self.info['interface']}:{port}"

    async def register(self, engine: SimEngine, host: int):
        """Register ``engine`` (behind host ``host`` of this process's, if it is hosts)."""
        link = self.links[host] if self.links else None
        reg = self.ctx.socket(zmq.DEALER)
        reg.IDENTITY, reg.LINGER = engine.ident, 0
        # behind a host relay, through it (registration by host), as a real engine does
        reg.connect(link.place.register_url if link else self.url(self.info["registration"]))
        try:
            self.session.send(reg, "registration_request", content=dict(uuid=engine.uuid))
            _, body = self.session.feed_identities(await reg.recv_multipart())
            reply = self.session.deserialize(body)["content"]
        finally:
            reg.close()
        if reply.get("status") != "ok":
            raise RuntimeError(f"registration refused: {reply}")
        engine.id, engine.host = int(reply["id"]), host
        leaves = self.info["broadcast"]
        if self.mux:
            engine.shell.connect(self.url(self.info["mux"]))
        # its heart beats from now on (the hub sets aside an engine silent for long after it registered);
        # behind a host relay it answers the relay, which answers the hub for the host
        engine.heart.connect(link.place.pong_url if link else self.url(self.info["hb_pong"]))
        self.hearts[host].append(engine)
        if link is None:
            engine.shell.connect(self.url(leaves[engine.id % len(leaves)]))
        else:  # joined once the whole tree routes to it, as a real engine does
            join = partial(link.join, engine.id, engine.uuid, self.session, maps=False, watch=not self.relays_here)
            await asyncio.get_running_loop().run_in_executor(self.joins, join)  # no shared memory: bytes, as over TCP
            engine.shell.connect(link.place.down_url)
        self.engines[engine.id] = engine
        self.server.command(("serve", engine))

    def beat(self):
        """Heartbeat thread: forward the heart monitor's pings (each host's, from
        its relay) to every live engine's heart, however busy the engines' event loop is."""
        poller, hosts = zmq.Poller(), {}
        for host, link in enumerate(self.links or [None]):
            ping = self.sync_ctx.socket(zmq.SUB)
            ping.SUBSCRIBE = b""
            ping.connect(link.place.ping_url if link else self.url(self.info["hb_ping"]))
            poller.register(ping, zmq.POLLIN)
            hosts[ping] = host
        while True:
            for ping, _ in poller.poll():
                frames = ping.recv_multipart()
                try:
                    while self.dead:
                        gone = self.dead.pop()
                        gone.heart.close()
                        self.hearts[gone.host].remove(gone)
                    for engine in list(self.hearts[hosts[ping]]):
                        if engine.alive:
                            engine.heart.send_multipart(frames)
                except Exception:  # the thread must go on: without it every engine is declared dead
                    log.exception("heartbeat forwarding failed once")

    def request(self, engine: SimEngine, frames):
        """One message on an engine's shell: answer it (at once, or after ``delay``)."""
        if P.is_probe(frames):  # a restarted host relay looking for us
            return
        if P.may_be_dropped(frames):  # the hub dropped it
            self.kill(engine.id)
            return
        args = self.answers.parse(engine, frames)
        if args is None:
            return
        if self.delay:
            self.server.later(self.delay, args)
        else:
            self.answer(*args)

    def answer(self, engine: SimEngine, *args):
        if not engine.alive:
            return
        reply, published = self.answers.answer(engine, *args)
        send_frames(engine.shell, reply)
        for frames in published:
            send_frames(self.iopub, frames)

    def kill(self, eid: int):
        """On the serving thread: engine ``eid`` stops answering and beating."""
        engine = self.engines.pop(eid, None)
        if engine is not None:
            engine.alive = False
            self.server.forget(engine)
            engine.shell.close()
            self.dead.append(engine)  # its heart is closed by the heartbeat thread

    async def main(self, conn):
        self.iopub = self.sync_ctx.socket(zmq.PUB)  # used by the serving thread
        self.iopub.SNDHWM = 0
        self.iopub.connect(self.url(self.info["iopub"]))
        threading.Thread(target=self.beat, daemon=True, name="heartbeats").start()
        threading.Thread(target=self.server.run, daemon=True, name="shells").start()
        for link in self.links:
            link.attach()  # under its leaf
            link.claim()  # the relay waits for these engines until they joined
        if self.relays_here:
            ready = threading.Event()
            threading.Thread(target=run_relays, args=(self.links, ready), daemon=True, name="relays").start()
            ready.wait()
        elif self.links:
            self.links[0].ensure_relay()
        hosts = len(self.links) or 1
        await asyncio.gather(*(self.register(SimEngine(self.sync_ctx), i % hosts) for i in range(self.count)))
        for link in self.links:
            link.release()
        conn.send(sorted(self.engines))
        loop = asyncio.get_running_loop()
        while True:  # commands from the parent: ("kill", eid) or ("stop",)
            command = await loop.run_in_executor(None, conn.recv)
            if command[0] == "kill":
                await loop.run_in_executor(None, self.server.call, self.kill, command[1])
                conn.send(command[1])
            else:
                break
        if self.relays_here:  # its hosts go with it: their files too (a relay that an engine started removes them)
            for link in self.links:
                link.place.remove_files()


def run_relays(links: list, ready: threading.Event, make_shell=None):
    """Relay thread: the relays of a farm process's hosts (``links``), on one
    loop. Each is the real relay (``HostRelayShell``), holding its host's lock,
    as one that an engine started would; it stays while the farm runs.
    ``make_shell(index, spec, ctx)``: another kind of relay shell (``simhost``)."""
    from ..relay.hostshell import HostRelayShell
    from ..relay.loop import ShellLoop

    make_shell = make_shell or (lambda index, spec, ctx: HostRelayShell(spec, ctx))

    ctx = zmq.Context()
    ctx.MAX_SOCKETS = 64 * len(links) + 64
    loop = ShellLoop()
    for index, link in enumerate(links):
        fd = link.take_lock()
        if fd is None:
            raise RuntimeError(f"another relay runs host {link.place.label}")
        loop.add(make_shell(index, dict(link.spec, lock_fd=fd, grace=FARM_GRACE), ctx))
    ready.set()
    loop.run()


class Server:
    """One thread serves every engine's shell of a ``SimProcess`` with one
    poller (a task per engine on asyncio costs more than the engine's own work).
    Other threads reach it through ``command``: an inproc socket wakes it."""

    def __init__(self, proc: SimProcess):
        self.proc = proc
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.wake_url = f"inproc://sim-wake-{id(self)}"
        self.wake_in = proc.sync_ctx.socket(zmq.PULL)
        self.wake_in.bind(self.wake_url)
        self.wakers = threading.local()
        self.poller = zmq.Poller()
        self.poller.register(self.wake_in, zmq.POLLIN)
        self.engines: dict[zmq.Socket, SimEngine] = {}
        self.due: list = []  # (when, n, args) of delayed answers, a heap
        self.seq = counter()

    def command(self, command: tuple):
        """From any thread: ``("serve", engine)`` or ``("call", fn, arg, done)``."""
        self.inbox.put(command)
        waker = getattr(self.wakers, "socket", None)
        if waker is None:
            waker = self.wakers.socket = self.proc.sync_ctx.socket(zmq.PUSH)
            waker.LINGER = 0
            waker.connect(self.wake_url)
        waker.send(b"")

    def call(self, fn, arg):
        """Run ``fn(arg)`` on the serving thread and wait for it."""
        done = threading.Event()
        self.command(("call", fn, arg, done))
        done.wait()

    def forget(self, engine: SimEngine):
        self.poller.unregister(engine.shell)
        self.engines.pop(engine.shell, None)

    def later(self, delay: float, args: tuple):
        heapq.heappush(self.due, (time.monotonic() + delay, next(self.seq), args))

    def run(self):
        while True:
            timeout = max(0.0, self.due[0][0] - time.monotonic()) * 1e3 if self.due else None
            for sock, _ in self.poller.poll(timeout):
                if sock is self.wake_in:
                    self._commands()
                    continue
                engine = self.engines.get(sock)
                for _ in range(64):  # then the others: one busy engine must not starve them
                    if engine is None or not engine.alive:
                        break
                    try:
                        frames = recv_frames(sock)
                    except zmq.Again:
                        break
                    try:
                        self.proc.request(engine, frames)
                    except Exception:  # one bad request must not silence the engines
                        log.exception("engine %s could not answer a request", engine.id)
            while self.due and self.due[0][0] <= time.monotonic():
                self.proc.answer(*heapq.heappop(self.due)[2])

    def _commands(self):
        while True:
            try:
                self.wake_in.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
        while not self.inbox.empty():
            command = self.inbox.get()
            if command[0] == "serve":
                engine = command[1]
                self.engines[engine.shell] = engine
                self.poller.register(engine.shell, zmq.POLLIN)
            else:
                _, fn, arg, done = command
                try:
                    fn(arg)
                finally:
                    done.set()


def _run_process(info, count, reply_bytes, delay, hosts, mux, in_relay, nice, conn):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if nice:  # (its host relay, started from here, inherits it)
        os.nice(nice)
    more_files()
    if in_relay:
        from .simhost import SimHostProcess

        SimHostProcess(info, count, reply_bytes, delay, hosts).main(conn)
    else:
        asyncio.run(SimProcess(info, count, reply_bytes, delay, hosts, mux).main(conn))


def more_files():
    """As many open files as this process may have (as root: up to the kernel's
    ``nr_open``): a thousand simulated engines hold a few thousand descriptors."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/sys/fs/nr_open") as f:
            ceiling = int(f.read())
        resource.setrlimit(resource.RLIMIT_NOFILE, (ceiling, ceiling))  # (root only)
        return
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class SimEngines:
    """A farm of ``n`` simulated engines, ``per_process`` to a process.

    ``start()`` returns once every engine is registered (its ids known);
    ``kill(eid)`` silences one engine; ``stop()`` ends the farm. ``nice``: the
    farm's processes (and host relays) run at that lower priority, so the
    controller on the same cores is served first, as if the engines ran on
    hosts of their own. ``hosts``: each process is ``hosts_per_process``
    simulated hosts, its engines spread over them; ``mux``: see ``SimProcess``;
    ``in_relay``: the hosts' relays simulate their engines themselves
    (``simhost.SimHostShell``: no engine sockets or threads; ``hosts`` only,
    without ``mux``), so that a thousand hosts fit on this machine.
    """

    def __init__(
        self,
        connection_file: str,
        n: int,
        per_process: int = 512,
        reply_bytes: int = 0,
        delay: float = 0.0,
        hosts: bool = False,
        nice: int = 0,
        hosts_per_process: int = 1,
        mux: bool = True,
        in_relay: bool = False,
    ):
        if in_relay and (mux or not hosts):
            raise ValueError("engines simulated by their host relay need hosts, and do not connect to the mux")
        with open(connection_file) as f:
            self.info = json.load(f)
        self.n, self.per_process, self.hosts, self.nice = n, per_process, hosts, nice
        self.reply_bytes, self.delay, self.mux, self.in_relay = reply_bytes, delay, mux, in_relay
        self.hosts_per_process = hosts_per_process if hosts else 0
        self.processes: list[tuple] = []  # (process, pipe, engine ids)
        self.relays_run: dict[int, list[str]] = {}  # a process that runs its hosts' relays -> their labels
        self._labels = counter()

    def start(self, timeout: float = 600) -> list[int]:
        left = self.n
        while left > 0:
            count = min(left, self.per_process)
            self._spawn(count)
            left -= count
        for _proc, pipe, ids in self.processes:
            self._registered(pipe, ids, timeout)
        return self.ids

    def _spawn(self, count: int) -> tuple:
        here, there = multiprocessing.Pipe()
        # new hosts each time (no more than engines)
        hosts = [f"{host_label()}-sim{next(self._labels)}" for _ in range(min(count, self.hosts_per_process))]
        proc = multiprocessing.Process(
            target=_run_process,
            args=(self.info, count, self.reply_bytes, self.delay, hosts, self.mux, self.in_relay, self.nice, there),
            daemon=True,
            name=f"SimEngines({count})",
        )
        proc.start()
        entry = (proc, here, [])
        self.processes.append(entry)
        if len(hosts) > 1 or self.in_relay:
            self.relays_run[proc.pid] = hosts
        return entry

    @staticmethod
    def _registered(pipe, ids, timeout):
        if not pipe.poll(timeout):
            raise TimeoutError(f"simulated engines did not register within {timeout} s")
        ids.extend(pipe.recv())

    def add(self, count: int, timeout: float = 120) -> list[int]:
        """One more process of ``count`` engines (with ``hosts``: new hosts); its ids."""
        _, pipe, ids = self._spawn(count)
        self._registered(pipe, ids, timeout)
        return list(ids)

    def kill_process(self, index: int) -> list[int]:
        """SIGKILL one process (with ``hosts``: its hosts, relays and all); its ids."""
        proc, pipe, ids = self.processes.pop(index)
        proc.kill()
        proc.join(5)
        for label in self.relays_run.pop(proc.pid, ()):  # (its relays were killed with it: their files go)
            Place(self.info["key"].encode(), label, curve=False).remove_files()
        return list(ids)

    @property
    def ids(self) -> list[int]:
        return sorted(e for _, _, ids in self.processes for e in ids)

    def kill(self, eid: int):
        """Silence engine ``eid``: no more replies or heartbeats (the hub
        unregisters it after its missed heartbeats)."""
        for _, pipe, ids in self.processes:
            if eid in ids:
                pipe.send(("kill", eid))
                pipe.recv()
                ids.remove(eid)
                return
        raise KeyError(f"no simulated engine {eid}")

    def stop(self):
        for proc, pipe, _ in self.processes:
            try:
                pipe.send(("stop",))
            except (BrokenPipeError, OSError):
                pass
            proc.join(5)
            if proc.is_alive():
                proc.kill()
        self.processes = []

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()


def main(argv=None):
    parser = argparse.ArgumentParser(description="Run simulated engines against a controller.")
    parser.add_argument("connection_file", help="the controller's ipcontroller-engine.json")
    parser.add_argument("--engines", type=int, default=256)
    parser.add_argument("--per-process", type=int, default=512)
    parser.add_argument("--reply-bytes", type=int, default=0)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--hosts", action="store_true", help="each process is a host, with its own host relay")
    parser.add_argument(
        "--hosts-per-process", type=int, default=1, help="with --hosts: hosts a process is (it runs their relays)"
    )
    parser.add_argument("--no-mux", action="store_true", help="engines do not connect to the hub's mux")
    parser.add_argument(
        "--in-relay", action="store_true", help="with --hosts --no-mux: each host's relay simulates its engines"
    )
    args = parser.parse_args(argv)
    farm = SimEngines(
        args.connection_file,
        args.engines,
        args.per_process,
        args.reply_bytes,
        args.delay,
        args.hosts,
        hosts_per_process=args.hosts_per_process,
        mux=not args.no_mux,
        in_relay=args.in_relay,
    )
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        print(f"{len(farm.start())} simulated engines registered; Ctrl-C stops them", flush=True)
        while True:
            signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        farm.stop()


def _interrupt(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    main()
