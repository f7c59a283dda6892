"""Real local clusters for integration tests (real processes, real sockets)."""

import contextlib
import os
import tempfile
import time

from traitlets.config import Config

import ipyparallel_broadcast as ipb


def skip_or_fail(why, what):
    """Skip, saying ``why`` (a missing Debian package, root); under ``CI=true``,
    where everything is installed, fail: CI must run ``what``."""
    import pytest

    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must run {what}: {why}")
    pytest.skip(why)


class Clock:
    """A clock that moves only when a test sets ``now``."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def quiet_config():
    """A test cluster's config: its launchers' (ipyparallel's ``Cluster``
    config does not reach the controller, whose heartbeat defaults, 0.8 s x 3,
    apply)."""
    return Config()


@contextlib.contextmanager
def running_cluster(n, depth, fanout, config=None, **kwargs):
    """Start a broadcast cluster of n engines; yield a connected ipb.Client.
    ``config``: the cluster's config (default: ``quiet_config()``)."""
    with tempfile.TemporaryDirectory(prefix="ipb-test-", dir=os.environ.get("IPB_TEST_DIR")) as profile_dir:
        cluster = ipb.Cluster(
            n=n,
            depth=depth,
            fanout=fanout,
            profile_dir=profile_dir,
            config=quiet_config() if config is None else config,
            log_level=int(os.environ.get("IPB_TEST_LOG_LEVEL", 40)),
            **kwargs,
        )
        try:
            rc = cluster.start_and_connect_sync()
        except TimeoutError:
            _diagnose_connect(cluster, profile_dir)
            cluster.stop_cluster_sync()
            raise
        rc.test_profile_dir = profile_dir  # tests find connection files here
        rc.broadcast_path = "tree"  # the tree's tests take it every time ('auto': test_paths.py)
        try:
            rc.wait_for_engines(n, timeout=60)
            yield rc
        finally:
            rc.close()
            cluster.stop_cluster_sync()
            os.environ.pop("IPP_CLUSTER_ID", None)


@contextlib.contextmanager
def terminal_shell():
    """An IPython shell for magics (``%px``), cleared afterwards."""
    from IPython.terminal.interactiveshell import TerminalInteractiveShell

    config = Config()
    config.TerminalInteractiveShell.simple_prompt = True
    try:
        yield TerminalInteractiveShell.instance(config=config)
    finally:
        TerminalInteractiveShell.clear_instance()


DIAGNOSES = []


def _diagnose_connect(cluster, profile_dir):
    """A client could not reach a live hub: record what the process and the
    controller look like, and whether a client on a fresh zmq context can."""
    import glob
    import subprocess
    import threading

    import zmq

    lines = [
        f"cluster {profile_dir}: {threading.active_count()} threads, "
        f"{len(os.listdir('/proc/self/fd'))} fds, global context "
        f"{len(getattr(zmq.Context.instance(), '_sockets', ()))} sockets"
    ]
    info = cluster.controller.get_connection_info()
    if not isinstance(info, dict):
        import asyncio

        info = asyncio.run(info)
    port = info["client"]["registration"]
    lines.append(f"  registration port {port}")
    try:
        ss = subprocess.run(["ss", "-tanp"], capture_output=True, text=True).stdout
    except OSError as e:
        ss = f"ss: {e} :{port} "
    lines += ["  " + ln for ln in ss.splitlines() if f":{port} " in ln][:20]
    ctx = zmq.Context()
    try:
        fresh = ipb.Client(info["client"], context=ctx, timeout=10)
        lines.append(f"  fresh-context client: connected, {len(fresh.ids)} engines")
        fresh.close()
    except Exception as e:
        lines.append(f"  fresh-context client: {e!r}")
    try:
        again = ipb.Client(info["client"], timeout=10)
        lines.append("  global-context client, second try: connected")
        again.close()
    except Exception as e:
        lines.append(f"  global-context client, second try: {e!r}")
    ctx.destroy(0)
    for path in glob.glob(os.path.join(profile_dir, "log", "*.log"))[:3]:
        with open(path) as f:
            lines.append(f"  {os.path.basename(path)} tail: " + f.read()[-1500:])
    DIAGNOSES.append("\n".join(lines))


def settled_stats(rc, timeout=10):
    """Every node's stats once none has a request pending (or at the timeout).

    A client can learn of a dead engine from the hub, and finish, a moment
    before the leaf hears of it and releases the request: state must be gone
    soon after, not necessarily at that instant. A leak still fails.
    """
    deadline = time.monotonic() + timeout
    while True:
        nodes = rc.broadcast_stats()
        if all(n.get("pending") == 0 for n in nodes) or time.monotonic() > deadline:
            return nodes
        time.sleep(0.05)


def until(predicate, timeout=60, what="a condition"):
    """Wait (polling) until ``predicate()`` is true; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def process_gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (gone, or a zombie not yet reaped). Asked
    in one step: between "it exists" and "its status", its parent may reap it."""
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def at_gate(path):
    """Engine side: hold until the file ``path`` exists; return the pid."""
    import os
    import time

    while not os.path.exists(path):
        time.sleep(0.02)
    return os.getpid()


def arrive_and_hold(folder):
    """Engine side: say "I have started" (a file named by the pid in ``folder``),
    hold until ``folder/go`` exists; return the pid."""
    import os
    import time

    open(os.path.join(folder, str(os.getpid())), "w").close()
    while not os.path.exists(os.path.join(folder, "go")):
        time.sleep(0.02)
    return os.getpid()


def arrived(folder):
    """The pids that ``arrive_and_hold`` has seen start in ``folder``."""
    return sorted(int(name) for name in os.listdir(folder) if name.isdigit())


def every_operation(rc, coalescing):
    """apply, execute, push/pull, scatter/gather, map, reduce and a subset of
    targets, through a BroadcastView in reply mode ``coalescing``."""
    view = rc.broadcast_view(coalescing=coalescing)
    assert view.apply_sync(lambda x: x + 1, 1) == [2] * len(rc.ids)
    view.execute("import os; here = os.getpid()", block=True)
    pids = view.pull("here", block=True)
    assert len(set(pids)) == len(rc.ids)
    view.push(dict(a=7), block=True)
    assert view.pull("a", block=True) == [7] * len(rc.ids)
    view.scatter("part", list(range(3 * len(rc.ids))), block=True)
    assert view.gather("part", block=True) == list(range(3 * len(rc.ids)))
    assert view.map_sync(lambda x: x * x, range(20)) == [x * x for x in range(20)]
    if coalescing is True:
        assert view.reduce(lambda: 2, op="sum", block=True) == 2 * len(rc.ids)
    targets = rc.ids[1::2]
    assert rc.broadcast_view(targets, coalescing=coalescing).apply_sync(lambda: 1) == [1] * len(targets)


def gated_clients(info: dict, gate):
    """Ours and a stock ``ipp.Client`` on the connection ``info``, their
    subscriptions to the hub's notifications held at ``gate``."""
    import ipyparallel as ipp

    gated = dict(info, notification=gate.port)
    ours = ipb.Client(gated, roster_timeout=0)  # (its wait for the roster would last the test)
    stock = ipp.Client(gated)
    until(lambda: gate.waiting() == 2, what="both clients' subscriptions at the gate")
    return ours, stock


class StandInRelay:
    """The test speaks for a host relay of ``host`` on the hub's registration
    socket of an engine-less cluster, its batches made by the relay's own
    ``Registrar``: ``with StandInRelay(host) as s:`` gives ``s.cluster``,
    ``s.rc`` (a client), ``s.relay``, ``s.codec`` and ``s.batch(sends)``."""

    def __init__(self, host: str, controller_args=(), timeout: float = 60, config=None):
        self.host, self.controller_args, self.timeout, self.config = host, list(controller_args), timeout, config

    def __enter__(self):
        import glob
        import json

        import zmq
        from jupyter_client.session import Session

        from ipyparallel_broadcast.relay.registrar import Registrar
        from ipyparallel_broadcast.wire import protocol as P

        self._tmp = tempfile.TemporaryDirectory(prefix="ipb-test-", dir=os.environ.get("IPB_TEST_DIR"))
        self.profile_dir = self._tmp.name
        self.cluster = ipb.Cluster(
            n=0, profile_dir=self.profile_dir, controller_args=self.controller_args, log_level=40, config=self.config
        )
        self.cluster.start_controller_sync()
        self.rc = self.cluster.connect_client_sync()
        (engine_file,) = glob.glob(os.path.join(self.profile_dir, "security", "*-engine.json"))
        with open(engine_file) as f:
            self.info = info = json.load(f)
        self.codec = P.Codec(Session(key=info["key"].encode(), signature_scheme=info["signature_scheme"]))
        self.relay = Registrar(self.codec, self.host)
        self.hub = zmq.Context.instance().socket(zmq.DEALER)
        self.hub.LINGER = 0
        self.hub.connect(f"{info['interface']}:{info['registration']}")
        return self

    def ask(self, uuid: str) -> int:
        """An engine of this host asks to register: the id the hub granted."""
        self.batch(self.relay.from_engine([b"engine-0"] + self.codec.pack("registration_request", dict(uuid=uuid))))
        return self.relay.granted[uuid]

    def batch(self, sends) -> list:
        """Send the batch among ``sends`` to the hub; the relay reads its answer
        (what it sends on, returned)."""
        from ipyparallel_broadcast.relay.registrar import HUB
        from ipyparallel_broadcast.wire.frames import send_frames

        (ask,) = [s for s in sends if s.socket == HUB]
        send_frames(self.hub, ask.frames)
        return self.heard()

    def heard(self) -> list:
        """The relay reads the hub's next message: what it sends on."""
        assert self.hub.poll(1000 * self.timeout), "the hub said nothing"
        return self.relay.from_hub(self.hub.recv_multipart())

    def beat(self) -> "StandInHeart":
        """The relay's heart beats, until its ``stop()``."""
        return StandInHeart(self.info, self.host)

    def __exit__(self, *exc):
        self.hub.close()
        self.rc.close()
        self.cluster.stop_cluster_sync()
        self._tmp.cleanup()


class StandInHeart:
    """A host relay's heart, as the hub's heart monitor sees one: its pings
    answered from a thread, until ``stop()``; ``answered``, how many."""

    def __init__(self, info: dict, host: str):
        import threading

        import zmq

        from ipyparallel_broadcast.wire.topology import host_ident

        ctx = zmq.Context.instance()
        self.ping, self.pong = ctx.socket(zmq.SUB), ctx.socket(zmq.DEALER)
        self.ping.linger = self.pong.linger = 0
        self.ping.setsockopt(zmq.SUBSCRIBE, b"")
        self.pong.IDENTITY = host_ident(host)
        self.ping.connect(f"{info['interface']}:{info['hb_ping']}")
        self.pong.connect(f"{info['interface']}:{info['hb_pong']}")
        self.answered = 0
        self.beating = threading.Event()
        self.beating.set()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while self.beating.is_set():
            if self.ping.poll(100):
                self.pong.send_multipart(self.ping.recv_multipart())
                self.answered += 1
        self.ping.close()
        self.pong.close()

    def stop(self):
        self.beating.clear()
        self.thread.join(5)
