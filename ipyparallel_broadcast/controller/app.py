"""``python -m ipyparallel_broadcast.controller``: ipcontroller with our relay tree.

Everything but broadcast is ipyparallel's own: hub, registration, heartbeats,
task queue. The IOPub, mux and control queues relay as ipyparallel's do, with
a hello for each new client on IOPub (``iopubrelay``) and malformed messages
dropped rather than a queue broken (``queues``). In place of its broadcast schedulers we
start one process per node of a tree of ``depth`` levels and ``fanout``
children per node; ``fanout ** depth`` leaves each serve the engines whose id
is their index modulo the number of leaves.

Every process the controller starts (relay nodes, queues, the task
scheduler, the heart monitor) is supervised: one that dies is restarted in
place (same ports), engines and clients reconnect to it by themselves, and
what it held fails at once: a relay node's by its parent (``relay.node``),
a queue's by the clients, told on the notices socket (``supervise``,
``notices``).
"""

from __future__ import annotations

import os
import secrets
import sys
from functools import partial

import zmq
from ipyparallel.controller.app import IPController
from ipyparallel.controller.app import aliases as ipp_aliases
from ipyparallel.util import disambiguate_url
from traitlets import Bool, Float, Type, Unicode, Union, default

from ..compat import ipp
from ..host.link import HOST_KEY, host_label
from ..relay.shell import run_node
from ..wire import protocol as P
from ..wire.logs import drop_unwritten_levels
from ..wire.naming import TREE_KEY
from ..wire.protocol import PROTOCOL_VERSION
from ..wire.topology import balanced_id, node_name
from .children import ChildSupervision
from .dropped import DroppedEngines
from .hostreg import HostRegistrations
from .hubhooks import HubHooks, HubParts
from .iopubrelay import run_iopub_relay
from .location import located
from .ports import quiet_port
from .queues import run_router_queue
from .records import BroadcastDictDB, BroadcastRecords
from .restore import KeptEngines
from .roster import Roster, RosterDoor
from .settings import TreeSettings
from .supervise import Supervisor, child_process

aliases = dict(ipp_aliases)
aliases.update(
    depth="BroadcastController.depth", fanout="BroadcastController.fanout", engines="BroadcastController.engines"
)


class BroadcastController(TreeSettings, ChildSupervision, IPController):
    # name stays "ipcontroller": profiles' ipcontroller_config.py applies as usual
    description = __doc__
    aliases = aliases

    db_class = Union(
        [Unicode(), Type()],
        default_value=BroadcastDictDB,
        config=True,
        help="The hub's record store: BroadcastDictDB (in memory, the default), or any of "
        "ipyparallel's (DictDB, SQLiteDB, MongoDB, NoDB).",
    )

    restarted = Bool(
        False,
        config=True,
        help="Set by the keeper that restarted this controller (with --restore): its "
        "connection files are removed at an orderly stop, as the first run's would be.",
    )
    restore_grace = Float(
        10.0,
        config=True,
        help="Seconds a restored controller (--restore) waits for each of its engines' hearts "
        "(or their host relay's) to beat again before it unregisters them.",
    )

    roster_door: RosterDoor | None = None  # made in place of ipyparallel's notifier, as init_hub binds it

    # upstream sizes its engine-facing broadcast ports from these
    @default("broadcast_scheduler_depth")
    def _no_upstream_tree(self):
        return 0

    @default("number_of_leaf_schedulers")
    def _leaves(self):
        return self.shape.n_leaves

    # Losing a host (engine and nanny at once) is noticed by heartbeats alone:
    # ipyparallel's 3 s x 10 misses take ~35 s; ours default to 0.8 s x 3 (~3.5 s).
    HEARTBEAT_DEFAULTS = dict(period=800, max_heartmonitor_misses=3)

    def init_hub(self):
        self.location = located(self) or self.location  # before the connection files are written
        drop_unwritten_levels(self.log)  # the hub logs every monitored message at DEBUG
        heartbeat = self.config.HeartMonitor
        for name, value in self.HEARTBEAT_DEFAULTS.items():
            if name not in heartbeat:  # what the user configured wins
                heartbeat[name] = value
        self.supervisor = Supervisor(self.node_restarts, self.node_restart_window)
        restore, self.restore_engines = self.restore_engines, False  # ours reads our journal, not its file
        super().init_hub()
        self.restore_engines = restore
        hub = self.hub
        if self.roster_door is None:
            raise RuntimeError("ipyparallel's hub no longer binds its notifier through bind(): see controller.roster")
        self._supervise_heart_monitor()
        dropped = DroppedEngines(hub)  # dead ids dropped; dropped engines that live told so
        path = os.path.join(self.profile_dir.log_dir, f"engines{self.cluster_id}.journal")
        self.kept = KeptEngines(hub, dropped, path)
        hosts = HostRegistrations(hub, self.roster_door.publish_registrations, dropped, self.kept.ledger)
        self.kept.open(restore, self.restore_grace, hosts)
        records = BroadcastRecords(hub) if self.hub_records else None
        self.hub_parts = HubParts(self._place, dropped, hosts, self.kept, self.roster_door, records)
        HubHooks(hub, self.hub_parts).install()
        inner = [path for path in self.shape.nodes() if not self.shape.is_leaf(path)]
        if sys.platform.startswith("linux"):  # abstract unix sockets: no file, gone with the process
            tag = f"ipb-{os.getpid()}-{secrets.token_hex(4)}"
            self.internal_urls = {path: f"ipc://@{tag}-{node_name(path)}" for path in inner}
        else:
            self.internal_urls = {path: f"tcp://127.0.0.1:{self.next_port()}" for path in inner}

    def bind(self, socket, url):
        """ipyparallel's; its notifier (a PUB) is not bound: our ``RosterDoor``
        (an XPUB) takes its address, and the hub's place once it exists."""
        if self.roster_door is None and url == self.client_url("notification") and socket.socket.type == zmq.PUB:
            xpub = socket.socket.context.socket(zmq.XPUB)
            self.roster_door = RosterDoor(xpub, socket.io_loop, Roster(self.session, engines=self._engine_table))
            socket = self.roster_door
        return super().bind(socket, url)

    def cleanup_connection_files(self):
        """An orderly stop: the journal goes (its engines stop too), and a
        restarted controller's files go as its first run's would have."""
        self.kept.close()
        if self.restarted:
            self.reuse_files = False
        super().cleanup_connection_files()

    def _engine_table(self) -> dict:
        return {eid: ec.uuid for eid, ec in self.hub.engines.items()}

    def next_port(self, pool_name="common"):
        """ipyparallel's: a configured pool's next port; a port it would pick at
        random comes from below the OS's ephemeral range instead (``ports``)."""
        pools = {
            "client": (self.client_ports, self.client_port_index),
            "engine": (self.engine_ports, self.engine_port_index),
        }
        pool, used = pools.get(pool_name, ((), 0))
        if len(pool) > used or len(self.ports) > self.port_index:
            return super().next_port(pool_name)
        return quiet_port() or super().next_port(pool_name)

    def _place(self, requested_id: int | None) -> int | None:
        """A new engine's id, on a least-loaded leaf (``topology.balanced_id``);
        an id an engine asks for is kept."""
        if requested_id is not None:
            return requested_id
        hub = self.hub
        live = list(hub.engines) + [ec.id for ec in hub.incoming_registrations.values()]
        return balanced_id(ipp.hub_next_id(hub), live, self.shape.n_leaves)

    def save_connection_dict(self, fname, cdict):
        """Tell clients and engines the tree's shape; engines also learn the
        controller's host (an engine elsewhere runs a host relay, see ``relay.hostshell``)."""
        cdict = dict(cdict)
        shape = self.shape
        cdict[TREE_KEY] = dict(
            depth=shape.depth,
            fanout=shape.fanout,
            protocol=PROTOCOL_VERSION,
            shm=self.shared_memory,
            shm_threshold=self.shared_memory_threshold,
            # host relays, which engines start, run with the tree's timing and data plane
            ping_interval=self.ping_interval,
            node_timeout=self.node_timeout,
            pause_limit=self.engine_pause_limit,
            bulk=self._bulk_spec(),
        )
        if self.auto_inputs:  # what an 'auto' shape was picked for
            cdict[TREE_KEY]["auto"] = self.auto_inputs
        if fname != self.client_json_file:
            cdict[HOST_KEY] = host_label()
        else:
            cdict[P.NOTICES_KEY] = self.notices_port
        return super().save_connection_dict(fname, cdict)

    def _bulk_spec(self) -> dict:
        """The data plane's settings, for every relay (host relays too)."""
        if not self.host_chunks:
            return dict(threshold=1 << 62)
        spec = dict(chunk=self.host_chunk_size, threshold=self.host_chunk_threshold, fanout=self.host_chunk_fanout)
        return dict(spec, reduce=self.host_reduce_shape, push=self.host_push_shape)

    def node_spec(self, path, monitor_url) -> dict:
        shape = self.shape
        session = self.session
        spec = dict(
            path=list(path),
            depth=shape.depth,
            fanout=shape.fanout,
            key=session.key.decode("ascii"),
            signature_scheme=session.signature_scheme,
            packer=session.packer,
            unpacker=session.unpacker,
            digest_history_size=session.digest_history_size,
            log_level=self.log_level,
            ping_interval=self.ping_interval,
            node_timeout=self.node_timeout,
            trim_interval=self.heap_trim_interval,
            shm=self.shared_memory,
            shm_threshold=self.shared_memory_threshold,
        )
        spec["bulk"] = self._bulk_spec()
        if self.hub_records:
            spec["monitor_url"] = monitor_url
        if path:
            spec["up_url"] = self._internal_url(path[:-1])
        else:
            spec["up_url"] = self.client_url("broadcast")
        if shape.is_leaf(path):
            spec["down_url"] = self.engine_url("broadcast", index=shape.leaf_index(path))
            spec["notification_url"] = disambiguate_url(self.client_url("notification"))
            spec["registration_url"] = disambiguate_url(self.client_url("registration"))
        else:
            spec["down_url"] = self._internal_url(path)
        if self.enable_curve:
            spec.update(
                curve_secretkey=self.curve_secretkey,
                curve_publickey=self.curve_publickey,
                curve_serverkey=self.curve_publickey,
            )
        return spec

    def _internal_url(self, path) -> str:
        """A link between two relay nodes, all on this host: a unix socket
        where there are abstract ones (half the copying of loopback TCP for a
        large bundle: 2.2 against 4.6 ms for 8 MB here), loopback TCP elsewhere."""
        return self.internal_urls[path]

    def launch_broadcast_schedulers(self, monitor_url, children):
        shape = self.shape
        self.log.info(
            "Broadcast tree: depth=%i fanout=%i, %i relay nodes, %i leaves",
            shape.depth,
            shape.fanout,
            shape.n_nodes,
            shape.n_leaves,
        )
        self.node_specs = {path: self.node_spec(path, monitor_url) for path in self.shape.nodes()}
        for path in self.node_specs:
            child = self.supervisor.add(f"relay node {node_name(path)}", partial(self._node_process, path))
            children.append(child.process)

    def init_schedulers(self):
        """ipyparallel's queues, with ours in place of three: IOPub (a hello
        for each client whose subscription is live, see ``iopubrelay``), mux
        and control (a malformed message is dropped, not a device broken: see
        ``queues``). Same sockets, same monitor copies."""
        super().init_schedulers()
        session = self.session
        common = dict(monitor_url=disambiguate_url(self.monitor_url))
        if self.enable_curve:
            common.update(curve_secretkey=self.curve_secretkey, curve_publickey=self.curve_publickey)
        iopub = dict(
            common,
            engine_url=self.engine_url("iopub"),
            client_url=self.client_url("iopub"),
            key=session.key.decode("ascii"),
            signature_scheme=session.signature_scheme,
            packer=session.packer,
            unpacker=session.unpacker,
        )
        self._replace_queue("IOPubScheduler", run_iopub_relay, iopub)
        for name, channel in (("DirectScheduler", "mux"), ("ControlScheduler", "control")):
            prefix = b"" if channel == "mux" else b"control"  # ipyparallel's names, as the hub reads them
            spec = dict(
                common,
                in_url=self.client_url(channel),
                out_url=self.engine_url(channel),
                in_identity=f"{channel}_in".encode(),
                out_identity=f"{channel}_out".encode(),
                in_prefix=b"in" + prefix,
                out_prefix=b"out" + prefix,
            )
            self._replace_queue(name, run_router_queue, spec)

    def _node_process(self, path):
        spec = self.node_specs[path]
        return child_process(run_node, f"RelayNode({node_name(path)})", f"ipb-node-{node_name(path)}", dict(spec=spec))


def main(*args, **kwargs):
    return BroadcastController.launch_instance(*args, **kwargs)


if __name__ == "__main__":
    main()
