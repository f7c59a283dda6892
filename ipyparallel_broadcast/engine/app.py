"""``python -m ipyparallel_broadcast.engine``: an ipyparallel engine whose
native thread pools are composed with those of its host's other engines.

It is ipyparallel's ``IPEngine`` plus a compose mode, set before anything
loads NumPy: ``--BroadcastEngine.compose=static|counting|default|tbb``
(``--compose=...`` for short). ``ipcluster``/``Cluster`` start it through
``BroadcastEngineSetLauncher``; ssh, MPI or batch launchers start it when
their ``engine_cmd`` is this module.
"""

from __future__ import annotations

import asyncio
import atexit
import gc
import time

import zmq
from ipyparallel.engine import app as ipp_engine_app
from ipyparallel.engine.app import aliases as engine_aliases
from traitlets import Bool, CaselessStrEnum, Dict, Enum, Float, Unicode, validate
from zmq.eventloop.zmqstream import ZMQStream

from ..compat.ipp import EngineSeam
from ..host.composedir import cluster_key
from ..host.link import HOST_KEY, JOIN_TIMEOUT, HostLink, host_label, port_range
from ..wire.logs import drop_unwritten_levels
from ..wire.naming import TREE_KEY
from . import compose
from .kernel import BroadcastKernel

ENGINE_CMD = ["-m", "ipyparallel_broadcast.engine"]

aliases = dict(engine_aliases, compose="BroadcastEngine.compose")


class BroadcastEngine(EngineSeam):
    compose = Enum(
        compose.MODES,
        "static",
        config=True,
        help="""How this engine's BLAS/OpenMP threads share the host with other engines:
        'static' (a fixed budget of cores*factor/engines-on-host threads),
        'counting' (the budget at rest; threads() regions take free cores from a
        host-wide token pool), 'default' (no limits) or 'tbb' (one IPC TBB pool).""",
    )
    compose_factor = Float(1.0, config=True, help="Oversubscription factor of the static budget.")
    compose_pin = Bool(False, config=True, help="Static mode: pin to this engine's slice of cores.")
    compose_requests = Bool(False, config=True, help="Counting mode: run every request in a threads() region.")
    compose_strict = Bool(False, config=True, help="Counting mode: regions wait for at least one token.")
    host_relay = CaselessStrEnum(
        ["auto", "always", "never"],
        "auto",
        config=True,
        help="""Reach the broadcast tree through a relay on this host (one per host,
        started by its engines; see ipyparallel_broadcast.relay.hostshell): 'auto' on a
        host other than the controller's, 'always', or 'never' (straight to a leaf).""",
    )
    host_relay_ip = Unicode(
        "",
        config=True,
        help="""The address this host's relay listens on for the chunks of big requests
        that other hosts send it (see ipyparallel_broadcast.relay.dataplane.push); a random port.
        Default: the address of the interface that reaches the controller.""",
    )
    host_relay_ports = Unicode(
        "",
        config=True,
        help="""The ports, 'low-high', this host's relay picks its port for other hosts' chunks
        from (see host_relay_ip): a range your firewall lets through between engine hosts.
        Default: any free port.""",
    )
    aliases = Dict(aliases)
    host_link = None

    @validate("host_relay_ports")
    def _port_range(self, proposal):
        port_range(proposal.value)  # raises on a bad range
        return proposal.value

    def init_engine(self):
        drop_unwritten_levels(self.log)
        super().init_engine()  # reads the connection file, which has the session key
        try:
            status = compose.configure(
                self.compose,
                key=cluster_key(self.session.key),
                factor=self.compose_factor,
                pin=self.compose_pin,
                requests=self.compose_requests,
                strict=self.compose_strict,
            )
        except compose.ComposeError as e:
            self.log.critical("cannot start in compose mode %r: %s", self.compose, e)
            self.exit(1)
        self.log.info(
            "compose %s: %i threads (%i cores, %i engines on %s, rank %s)",
            status["mode"],
            status["budget"],
            status["cores"],
            status["engines_on_host"],
            status["host"],
            status["rank"],
        )

    _stopped_by_signal = False

    def _on_stop_signal(self, sig, frame):
        self._stopped_by_signal = True
        super()._on_stop_signal(sig, frame)

    def start(self):
        """ipyparallel's, but stopped by SIGTERM (how launchers stop an engine;
        it ignores SIGINT) the engine exits 0. ipyparallel's stops its loop under
        ``run_sync``, which raises, so every engine exited 1 and each cluster stop
        in Jupyter logged every engine's whole output as a failure."""
        try:
            super().start()
        except RuntimeError:
            if not self._stopped_by_signal:
                raise
            self.log.info("stopped")

    def start_heartbeat(self, hb_ping, hb_pong, hb_period, identity):
        """ipyparallel's heart, but the main thread no longer wakes for each
        ping: ``_check_heart`` (every period + 0.5 s) drains the pings that came
        (a Python wake-up per ping in every engine cost idle clusters CPU).
        Behind a host relay the heart beats to the relay, which passes the
        hub's pings on and answers for its host (``relay.enginehearts``)."""
        if self.host_link is None:
            super().start_heartbeat(hb_ping, hb_pong, hb_period, identity)
        else:
            place, hub_key = self.host_link.place, self.curve_serverkey
            self.curve_serverkey = place.public or hub_key  # ipyparallel's Heart takes the server key from here
            try:
                super().start_heartbeat(place.ping_url, place.pong_url, hb_period, identity)
            finally:
                self.curve_serverkey = hub_key
        stream = self._heart_stream
        if stream is not None:
            stream.stop_on_recv()
            stream.io_loop.remove_handler(stream.socket)  # its fd no longer wakes the loop

    def _check_heart(self):
        if self._heart_stream is not None and _drain(self._heart_stream.socket):
            self._heart_last_ping = time.time()
        super()._check_heart()

    def _use_host_relay(self) -> bool:
        info = self.connection_info
        if self.host_relay == "never" or TREE_KEY not in info or self.using_ssh:
            return False
        return self.host_relay == "always" or info.get(HOST_KEY) != host_label()

    async def register(self):
        """ipyparallel's, but behind a host relay the request goes to the relay
        (started here if need be), which registers its host's engines with the
        hub in batches (``relay.registrar``); the reply is the hub's own."""
        if self._use_host_relay():
            self.host_link = HostLink.from_connection(
                self.connection_info,
                self.session,
                host_label(),
                self.curve_serverkey,
                self.log_level,
                ip=self.host_relay_ip,
                ports=port_range(self.host_relay_ports),
            )
            self.host_link.attach()  # under its leaf
            self.host_link.claim()  # the relay waits for this engine until it joined
            self.host_link.ensure_relay()
            self.timeout = max(self.timeout, JOIN_TIMEOUT)  # the relay may be starting (a Python process)
        await super().register()

    def init_connector(self):
        """ipyparallel's; behind a host relay, the registration socket
        connects to the relay (the nanny still tells the hub itself)."""
        connect, maybe_tunnel = super().init_connector()
        if self.host_link is None:
            return connect, maybe_tunnel
        hub_url, place = self.registration_url, self.host_link.place

        def via_relay(sock, url, curve_serverkey=None):
            if url != hub_url:
                return connect(sock, url, curve_serverkey=curve_serverkey)
            self._relay_keys(sock)
            sock.connect(place.register_url)

        return via_relay, maybe_tunnel

    def _relay_keys(self, sock):
        """A socket to the host relay: its derived server key, this engine's keys."""
        if self.host_link.place.public:
            sock.curve_serverkey = self.host_link.place.public
            sock.curve_publickey, sock.curve_secretkey = self.curve_publickey, self.curve_secretkey

    async def complete_registration(self, msg, connect, maybe_tunnel):
        ipp_engine_app.Kernel = BroadcastKernel  # the kernel class ipyparallel instantiates
        if self.host_link is not None:
            connect = await self._join_host_relay(msg, connect)
        await super().complete_registration(msg, connect, maybe_tunnel)
        if self.kernel is not None:
            compose.runtime().attach(self.kernel)
            self._registrar_stream = ZMQStream(self.registrar, self.loop)
            self._registrar_stream.on_recv(self._from_hub, copy=False)
        gc.collect()
        gc.freeze()  # start-up's objects (IPython, modules): a full collection took 13-20 ms, a stalled reply

    def _from_hub(self, frames):
        """The hub, after registration, speaks only to drop this engine
        (see ``controller.dropped``): anything else is logged and ignored."""
        if not self.kernel.on_drop_notice(frames):
            self.log.warning("unexpected message on the registration socket: ignored")

    async def _join_host_relay(self, msg, connect):
        """Join this host's relay (started if need be); return a ``connect``
        that takes the broadcast socket to it instead of to a leaf."""
        content = self.session.unpack(self.session.feed_identities(msg)[1][4])
        link = self.host_link
        if content.get("status") != "ok":
            link.release()
            return connect  # ipyparallel reports the refusal
        eid, uuid = content["id"], self.bident.decode()
        place, leaves = link.place, link.leaves
        try:
            await asyncio.get_running_loop().run_in_executor(None, link.join, eid, uuid, self.session)
        finally:
            link.release()
        atexit.register(link.leave, uuid)
        self.log.info("broadcasts reach this engine through the relay of host %s", place.label)

        def via_relay(sock, url, curve_serverkey=None):
            if url not in leaves:
                return connect(sock, url, curve_serverkey=curve_serverkey)
            self._relay_keys(sock)
            sock.connect(place.down_url)

        return via_relay


def _drain(sock) -> int:
    """Read and drop what ``sock`` holds now; return how many messages."""
    n = 0
    while True:
        try:
            sock.recv(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return n
        n += 1


main = launch_new_instance = BroadcastEngine.launch_instance

if __name__ == "__main__":
    main()
