"""``SimHostShell``: a host relay that simulates its host's engines itself.

A farm of simulated engines with sockets of their own (``sim.SimProcess``)
costs a process descriptors and a thread's work per engine: a thousand hosts
of a hundred engines do not fit on two cores. Here the engines have no socket
and no thread. The relay is the real one (``HostRelayShell``: its node, its
registrar and its engines' hearts, on the shared ``relay.loop``), and what its
engines would send it goes in as if read from the socket it would come on:

- each engine's ``registration_request``, on the registration socket, when
  the relay starts; the hub's answer gives it its id, and it joins (``ipb_join``
  on the join socket, with no process to watch);
- its heart's answer to every ping the relay passes on, on the pong socket;
- its reply to each request sent to it, on the engines' socket
  (``simanswers.EngineAnswers``); what it publishes goes to the hub's IOPub.

Everything after that is the relay's own code: batches to the hub, the
announcement to the leaf, the replies merged and sent up. ``kill(eid)`` makes
an engine fall silent (from any thread): its relay finds it unreachable, or
misses its heart, as it would a dead engine's.
"""

from __future__ import annotations

import heapq
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from functools import partial
from itertools import count as counter

import zmq

from ..host.link import HostLink
from ..relay.enginehearts import ENGINE_PING
from ..relay.events import DOWN, Send
from ..relay.hostshell import HostRelayShell
from ..relay.registrar import ENGINES
from ..wire import protocol as P
from ..wire.frames import send_frames
from .sim import run_relays, session_from
from .simanswers import EngineAnswers, SimEngineState

log = logging.getLogger(__name__)
TAKEN_PER_TURN = 4096  # engines' messages handled per loop turn: the relay's sockets are read between


class SimHostShell(HostRelayShell):
    """A host relay and ``engines`` simulated engines behind it, with no engine socket."""

    def __init__(
        self,
        spec: dict,
        context: zmq.Context,
        engines: int,
        answers: EngineAnswers,
        publish: Callable[[list], None],
        joined: Callable[[int], None],
        delay: float = 0.0,
    ):
        """``publish(frames)``: an engine's IOPub message out; ``joined(eid)``: an
        engine is registered and reachable through the tree; ``delay``: seconds
        before each reply."""
        if not spec.get("registration_url"):
            raise ValueError("simulated engines register through their host relay: the hub's registration url")
        self.sim: dict[bytes, SimEngineState] = {e.ident: e for e in (SimEngineState() for _ in range(engines))}
        self.by_id: dict[int, SimEngineState] = {}
        self.answers, self.publish, self.on_engine_joined, self.delay = answers, publish, joined, delay
        self.inbox: deque = deque()  # (handler, frames): what the engines sent, as if read from a socket
        self.due: list = []  # (when, n, request) of delayed replies, a heap
        self.seq = counter()
        self.engine_side = {ENGINES: self.registration_answer, ENGINE_PING: self.passed_on_ping, DOWN: self.to_engine}
        super().__init__(spec, context)

    # ------------------------------------------------------------ engines send
    def begin(self):
        super().begin()
        register = self.handlers[self.hub_side.register]
        for engine in self.sim.values():
            request = self.codec.pack("registration_request", {"uuid": engine.uuid})
            self.inbox.append((register, [engine.ident, *request]))

    def after_turn(self, ticked: bool):
        """The engines' messages due, handled as the relay's sockets' are (``NodeShell.read``)."""
        now = time.monotonic()
        while self.due and self.due[0][0] <= now:
            self.reply(heapq.heappop(self.due)[2])
        for _ in range(min(len(self.inbox), TAKEN_PER_TURN)):
            handler, frames = self.inbox.popleft()
            try:
                self.perform(handler(frames))
            except Exception:  # a bug must not take the relay down
                self.log.exception("error handling a simulated engine's message")
        super().after_turn(ticked)

    def next_deadline(self):
        if self.inbox:
            return time.monotonic()
        times = [t for t in (super().next_deadline(), self.due[0][0] if self.due else None) if t is not None]
        return min(times, default=None)

    # ----------------------------------------------------- the relay sends them
    def perform(self, sends: list[Send]):
        rest = []
        for send in sends:
            to_engines = self.engine_side.get(send.socket)
            if to_engines is None:
                rest.append(send)
            else:
                rest += to_engines(send.frames)
        super().perform(rest)

    def registration_answer(self, frames) -> list[Send]:
        """The hub's answer to an engine's registration (or its drop notice), through the registrar."""
        idents, body = P.split_idents(frames)
        engine = self.sim.get(P.as_bytes(idents[0])) if idents else None
        if engine is None:
            return []
        msg = self.codec.unpack(body)
        if msg["header"].get("msg_type") == P.DROPPED:
            engine.alive = False
            return []
        reply = msg["content"]
        if reply.get("status") != "ok":
            log.warning("simulated engine %s refused: %s", engine.uuid, reply)
            engine.alive = False
            return []
        engine.id = reply["id"]
        self.by_id[engine.id] = engine
        join = dict(eid=engine.id, uuid=engine.uuid, pid=None, process=False)  # no process to watch: hearts tell
        self.inbox.append((self.handlers[self.joins], [engine.ident, *self.codec.pack(P.JOIN, join)]))
        return []

    def on_joined(self, who):
        """Engines reachable through the tree: the farm is told; real ones are answered."""
        for idents in who:
            engine = self.sim.get(P.as_bytes(idents[0])) if idents else None
            if engine is None:
                super().on_joined([idents])
            elif engine.id is not None:
                self.on_engine_joined(engine.id)

    def passed_on_ping(self, frames) -> list[Send]:
        """A ping of the hub's, passed on: every live engine's heart answers it."""
        pong = self.handlers[self.hub_side.pong_in]
        ping = [P.as_bytes(f) for f in frames]
        self.inbox.extend((pong, [e.ident, *ping]) for e in self.sim.values() if e.alive and e.id is not None)
        return []

    def to_engine(self, frames) -> list[Send]:
        """A message to an engine: a request is answered; one to an engine that is silent
        is unreachable, as a dead engine's socket is (``ROUTER_MANDATORY``)."""
        engine = self.sim.get(P.as_bytes(frames[0]))
        if engine is None or not engine.alive:
            return self._unreachable(*frames[:2])
        if P.is_probe(frames):
            return []
        if P.may_be_dropped(frames):  # the hub dropped it
            engine.alive = False
            return []
        request = self.answers.parse(engine, frames)
        if request is not None and self.delay:
            heapq.heappush(self.due, (time.monotonic() + self.delay, next(self.seq), request))
        elif request is not None:
            self.reply(request)
        return []

    def reply(self, request: tuple):
        engine = request[0]
        if not engine.alive:
            return
        reply, published = self.answers.answer(*request)
        self.inbox.append((self.handlers[self.down], reply))
        for frames in published:
            self.publish(frames)

    def engine_alive(self, uuid: str) -> bool | None:
        """A simulated engine's "process" is this one: alive unless killed. A late
        heart is then a paused engine's, kept a while, as a real host keeps a
        live process's (``enginehearts``); a killed one's silence is its death."""
        engine = self.sim.get(uuid.encode())
        return engine.alive if engine is not None else super().engine_alive(uuid)

    # -------------------------------------------------------------- the farm
    def kill(self, eid: int) -> bool:
        """Engine ``eid`` falls silent (any thread); False: not one of this relay's."""
        engine = self.by_id.get(eid)
        if engine is None:
            return False
        engine.alive = False
        return True


class SimHostProcess:
    """A farm process that is ``hosts``, each a ``SimHostShell`` with its share of
    ``count`` engines, all on one loop (``sim.run_relays``). It answers its parent
    as ``sim.SimProcess`` does: the engines' ids once all joined, then ``kill``
    and ``stop``."""

    def __init__(self, info: dict, count: int, reply_bytes: int = 0, delay: float = 0.0, hosts: list[str] = ()):
        if not hosts:
            raise ValueError("engines simulated by their relay need a host")
        self.info, self.count, self.delay = info, count, delay
        session = session_from(info)
        self.links = [HostLink.from_connection(info, session, label) for label in hosts]
        self.answers = EngineAnswers(session, reply_bytes)
        self.counts = [count // len(hosts) + (i < count % len(hosts)) for i in range(len(hosts))]
        self.joined: queue.SimpleQueue = queue.SimpleQueue()  # ids of engines joined, from the relay thread
        self.shells: list[SimHostShell] = []
        self.iopub: zmq.Socket | None = None  # the engines' IOPub, made on the relay thread

    def make_shell(self, index: int, spec: dict, ctx: zmq.Context) -> SimHostShell:
        """On the relay thread (``run_relays``): host ``index``'s relay and engines."""
        if self.iopub is None:
            self.iopub = ctx.socket(zmq.PUB)
            self.iopub.SNDHWM = 0
            iopub = self.info["iopub"]
            self.iopub.connect(iopub if "://" in str(iopub) else f"{self.info['interface']}:{iopub}")
        publish = partial(send_frames, self.iopub)
        shell = SimHostShell(spec, ctx, self.counts[index], self.answers, publish, self.joined.put, self.delay)
        self.shells.append(shell)
        return shell

    def main(self, conn):
        for link in self.links:
            link.attach()  # under its leaf
            link.claim()  # the relay waits for these engines until they joined
        ready = threading.Event()
        relays = threading.Thread(target=run_relays, args=(self.links, ready, self.make_shell), daemon=True)
        relays.start()
        while not ready.wait(1.0):
            self._relays_run(relays)
        ids: set[int] = set()
        while len(ids) < self.count:
            try:
                ids.add(self.joined.get(timeout=1.0))
            except queue.Empty:
                self._relays_run(relays)
        for link in self.links:
            link.release()
        conn.send(sorted(ids))
        while True:  # commands from the parent: ("kill", eid) or ("stop",)
            command = conn.recv()
            if command[0] != "kill":
                break
            if not any(shell.kill(command[1]) for shell in self.shells):
                log.warning("no simulated engine %s here", command[1])
            conn.send(command[1])
        for link in self.links:  # its hosts go with it: their files too
            link.place.remove_files()

    @staticmethod
    def _relays_run(relays: threading.Thread):
        if not relays.is_alive():  # (its exception is in the log)
            raise RuntimeError("the simulated hosts' relays stopped")
