"""The soak's nemesis: faults injected at random on a live bed, several at a
time. Each fault is a method that starts it and, where it lasts, schedules its
end on a timer; ``calm()`` ends every fault still on (links up, paused
processes resumed, ``/dev/shm`` emptied). ``log`` records what was done when.

The bed (``soak.SoakBed``) gives what the faults act on: real engines per host,
simulated hosts, a client for stats surveys, the controller's URLs and key.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable

import zmq
from jupyter_client.session import Session

FAULTS = (
    "kill_engine",
    "kill_host_relay",
    "kill_node",
    "kill_queue",
    "cut_link",
    "pause",
    "garbage",
    "replay",
    "flood_link",
    "fill_shm",
    "kill_sim_host",
    "kill_controller",
    "kill_keeper",
)


class Nemesis:
    def __init__(self, bed, seed: int = 0, heartbeat: float = 2.4, faults=FAULTS):
        self.bed, self.rng, self.heartbeat = bed, random.Random(seed), heartbeat
        self.faults = list(faults)
        self.log: list[tuple] = []  # (time, fault, detail)
        self._undo: dict[int, Callable] = {}  # pending ends of lasting faults
        self._lock = threading.Lock()
        self._ids = iter(range(1 << 62))
        self.ctx = zmq.Context.instance()

    # ------------------------------------------------------------- running
    def strike(self) -> str:
        fault = self.rng.choice(self.faults)
        try:
            detail = getattr(self, fault)()
        except Exception as e:  # a target vanished meanwhile: a fault not made is no failure
            detail = f"skipped: {e!r}"
        self.log.append((time.time(), fault, detail))
        return fault

    def later(self, seconds: float, undo: Callable):
        key = next(self._ids)
        with self._lock:
            self._undo[key] = undo

        def end():
            with self._lock:
                action = self._undo.pop(key, None)
            if action is not None:
                action()

        timer = threading.Timer(seconds, end)
        timer.daemon = True
        timer.start()

    def calm(self):
        """End every fault still on, at once."""
        with self._lock:
            actions, self._undo = list(self._undo.values()), {}
        for action in actions:
            try:
                action()
            except Exception:
                pass

    # -------------------------------------------------------------- faults
    def _survey(self) -> list[dict]:
        return self.bed.survey()

    def kill_engine(self) -> str:
        pid = self.rng.choice(self.bed.engine_pids())
        os.kill(pid, signal.SIGKILL)
        return f"engine pid {pid}"

    def kill_host_relay(self) -> str:
        relays = [
            n for n in self._survey() if n.get("host") and n.get("pid") and "-sim" not in n["host"]
        ]  # a simulated host's relay is its process (kill_sim_host)
        victim = self.rng.choice(relays)
        os.kill(victim["pid"], signal.SIGKILL)
        return f"host relay {victim['host']} pid {victim['pid']}"

    def kill_node(self) -> str:
        nodes = [n for n in self._survey() if not n.get("host") and n.get("pid")]
        victim = self.rng.choice(nodes)
        os.kill(victim["pid"], signal.SIGKILL)
        return f"tree node {victim['node']} pid {victim['pid']}"

    def kill_queue(self) -> str:
        """One of the controller's other children: its mux, control or task
        queue, its IOPub relay, its heart monitor (restarted in place)."""
        children = self.bed.controller_children()
        name = self.rng.choice(sorted(children))
        os.kill(children[name], signal.SIGKILL)
        return f"{name} pid {children[name]}"

    def kill_controller(self) -> str:
        """The controller's main process (its hub): its keeper starts it
        again with ``--restore``, engines and clients kept."""
        pid = self.bed.cluster.kill_controller()
        return f"controller pid {pid}"

    def kill_keeper(self) -> str:
        """The controller's keeper, while the controller runs: the controller goes
        on, and starts a keeper that adopts it (a later ``kill_controller`` is
        still restarted). Not between two runs of the controller: both dead
        at once is a double fault that nothing on the host outlives."""
        if self.bed.cluster.hub_pid() is None:
            return "skipped: the controller is between two runs"
        pid = self.bed.cluster.kill_keeper()
        return f"keeper pid {pid}"

    def cut_link(self) -> str:
        host = self.rng.choice(self.bed.bed.hosts)
        hold = self.rng.uniform(1, 3 * self.heartbeat)
        self.bed.bed.set_link(host, False)
        self.later(hold, lambda: self.bed.bed.set_link(host, True))
        return f"{host.name} down for {hold:.1f} s"

    def pause(self) -> str:
        nodes = self._survey()
        pids = self.bed.engine_pids() + [n["pid"] for n in nodes if n.get("pid")]
        pid = self.rng.choice(pids)
        hold = self.rng.uniform(self.heartbeat, 2.5 * self.heartbeat)  # past the heartbeat period
        os.kill(pid, signal.SIGSTOP)
        self.later(hold, lambda: _signal(pid, signal.SIGCONT))
        return f"pid {pid} stopped for {hold:.1f} s"

    def _dealers(self) -> list[zmq.Socket]:
        socks = []
        for url in self.bed.urls():
            sock = self.ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(url)
            socks.append(sock)
        return socks

    def _blast(self, frames_list) -> int:
        socks = self._dealers()
        try:
            for sock in socks:
                for frames in frames_list:
                    sock.send_multipart(frames)
            time.sleep(0.2)  # (zmq sends in the background: let them go before closing)
        finally:
            for sock in socks:
                sock.close()
        return len(socks)

    def garbage(self) -> str:
        junk = []
        for _ in range(5):
            frames = [os.urandom(self.rng.randint(0, 64)) for _ in range(self.rng.randint(1, 7))]
            if self.rng.random() < 0.5:  # looks like a message, forged
                frames = [b"<IDS|MSG>", b"0" * 64, b"{}", b"{}", b"{}", b"{]"] + frames
            junk.append(frames)
        return f"5 junk messages to each of {self._blast(junk)} sockets"

    def replay(self) -> str:
        """A real signed request, sent to every socket, then all of it again."""
        from ipyparallel.serialize import pack_apply_message

        from . import engine_side as E

        session = Session(key=self.bed.key, signature_scheme="hmac-sha256")
        token = f"nemesis:{next(self._ids)}"
        engine = self.rng.choice(self.bed.engine_uuids())
        msg = session.msg("apply_request", content={}, metadata={})
        frames = [engine.encode()] + session.serialize(msg) + pack_apply_message(E.logged, (token,), {})
        n = self._blast([frames, frames])
        return f"apply {token} to engine {engine[:8]} twice on each of {n} sockets"

    def flood_link(self) -> str:
        host = self.rng.choice(self.bed.bed.hosts)
        seconds = self.rng.uniform(2, 6)
        self.bed.flood(host, seconds)
        return f"{host.name} floods its link for {seconds:.1f} s"

    def fill_shm(self) -> str:
        path = os.path.join(self.bed.shm_dir, f"nemesis-fill-{next(self._ids)}")
        written = 0
        with open(path, "wb") as f:
            block = b"\0" * (1 << 20)
            try:
                while True:
                    f.write(block)
                    f.flush()
                    written += len(block)
            except OSError:
                pass
        hold = self.rng.uniform(2, 6)
        self.later(hold, lambda: _unlink(path))
        return f"{written >> 20} MiB in shared memory for {hold:.1f} s"

    def kill_sim_host(self) -> str:
        return self.bed.kill_sim_host(self.rng)


def _signal(pid, sig):
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _unlink(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
