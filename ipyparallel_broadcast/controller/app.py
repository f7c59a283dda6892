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

The controller holds its parts: its children supervised
(``children.ChildSupervision``), what each is told (``nodespecs.ChildSpecs``),
the hub's hooks and what they call (``hubhooks``), its keeper watched
(``keeperwatch.KeeperWatch``: one that dies is replaced by one that adopts it). Its one base besides
``IPController`` is its settings (``settings.TreeSettings``, traits only but
the shape they make): traitlets reads ``c.BroadcastController.depth`` from
the class's own traits.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from functools import partial

import zmq
from ipyparallel.controller.app import IPController
from ipyparallel.controller.app import aliases as ipp_aliases
from tornado.ioloop import IOLoop, PeriodicCallback
from traitlets import Bool, Float, Type, Unicode, Union, default

from ..compat import ipp
from ..host.link import HOST_KEY, host_label
from ..relay.shell import run_node
from ..wire import protocol as P
from ..wire.logs import drop_unwritten_levels
from ..wire.naming import TREE_KEY
from ..wire.topology import node_name
from .children import ChildSupervision
from .dropped import DroppedEngines
from .hostreg import HostRegistrations
from .hubhooks import HubHooks, HubParts
from .keeperwatch import KeeperWatch
from .location import located
from .nodespecs import ChildSpecs
from .placement import LeafLoads
from .ports import quiet_port
from .records import BroadcastDictDB, BroadcastRecords
from .restarts import KEEPER_GONE, keeper_file, keeper_settings
from .restore import KeptEngines
from .roster import Roster, RosterDoor
from .settings import TreeSettings
from .supervise import child_process

aliases = dict(ipp_aliases)
aliases.update(
    depth="BroadcastController.depth", fanout="BroadcastController.fanout", engines="BroadcastController.engines"
)


class BroadcastController(TreeSettings, IPController):
    # name stays "ipcontroller": profiles' ipcontroller_config.py applies as usual
    description = __doc__
    aliases = aliases

    db_class = Union(
        [Unicode(), Type()],
        default_value=BroadcastDictDB,
        config=True,
        help="The hub's record store: BroadcastDictDB (in memory, the default), or any of "
        "ipyparallel's (DictDB, SQLiteDB, MongoDB, NoDB). SQLiteDB keeps the records across a "
        "restart (--restore): those filed more than a few seconds before the controller died.",
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
    keepers: KeeperWatch | None = None  # its keeper, watched (a dead one replaced), made as the hub is
    kids: ChildSupervision | None = None  # its children supervised, made as the hub is
    loads: LeafLoads | None = None  # live engines per leaf (where a new engine goes), made as the hub is

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
        self.kids, self.specs = ChildSupervision(self), ChildSpecs(self)  # (the connection files name their ports)
        restore, self.restore_engines = self.restore_engines, False  # ours reads our journal, not its file
        self.db_class = stores().get(self.db_class, self.db_class)
        super().init_hub()
        self.restore_engines = restore
        hub = self.hub
        if self.roster_door is None:
            raise RuntimeError("ipyparallel's hub no longer binds its notifier through bind(): see controller.roster")
        self.kids.supervise_heart_monitor()
        dropped = DroppedEngines(hub)  # dead ids dropped; dropped engines that live told so
        path = os.path.join(self.profile_dir.log_dir, f"engines{self.cluster_id}.journal")
        place = keeper_file(self.profile_dir.location, self.cluster_id)
        self.keepers = KeeperWatch(self.log, keeper_settings(), place, path)
        self.loads = LeafLoads(self.shape.n_leaves)  # live engines per leaf, told by the engine ledger
        self.kept = KeptEngines(hub, dropped, path, self.loads)
        door = self.roster_door
        hosts = HostRegistrations(hub, door.publish_registrations, dropped, self.kept.ledger, door.held)
        self.kept.open(restore, self.restore_grace, hosts)
        for eid in [*hub.engines, *(ec.id for ec in hub.incoming_registrations.values()), *hosts.pending_ids()]:
            self.loads.live(eid)  # those a restart restored (filed without the ledger: its journal had them)
        records = BroadcastRecords(hub) if self.hub_records else None
        self.hub_parts = HubParts(self._place, dropped, hosts, self.kept, self.roster_door, records)
        HubHooks(hub, self.hub_parts).install()

    def bind(self, socket, url):
        """ipyparallel's; its notifier (a PUB) is not bound: our ``RosterDoor``
        (an XPUB) takes its address, and the hub's place once it exists."""
        if self.roster_door is None and url == self.client_url("notification") and socket.socket.type == zmq.PUB:
            xpub = socket.socket.context.socket(zmq.XPUB)
            self.roster_door = RosterDoor(xpub, socket.io_loop, Roster(self.session, engines=self._engine_table))
            socket = self.roster_door
        return super().bind(socket, url)

    def init_signal(self):
        super().init_signal()
        signal.signal(KEEPER_GONE, self.keeper_gone)

    def keeper_gone(self, sig, frame):
        """Its keeper died (``launch.keeper``): the controller goes on, and
        starts a keeper that adopts it (``keeperwatch``), on its loop."""
        if self.keepers is not None:
            IOLoop.current().add_callback(self.keepers.lost)

    def cleanup_connection_files(self):
        """An orderly stop: the journal goes (its engines stop too), with the
        keeper file, and a restarted controller's files go as its first run's
        would have."""
        self.kept.close()
        if self.keepers is not None:
            self.keepers.stop()
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
        """A new engine's id, on a least-loaded leaf (``placement``);
        an id an engine asks for is kept."""
        if requested_id is not None:
            return requested_id
        return self.loads.place(ipp.hub_next_id(self.hub))

    def save_connection_dict(self, fname, cdict):
        """Tell clients and engines the tree's shape; engines also learn the
        controller's host (an engine elsewhere runs a host relay, see ``relay.hostshell``)."""
        cdict = dict(cdict)
        cdict[TREE_KEY] = self.specs.tree_info()
        if fname != self.client_json_file:
            cdict[HOST_KEY] = host_label()
        else:
            cdict[P.NOTICES_KEY] = self.kids.notices_port
        path = os.path.join(self.profile_dir.security_dir, fname)
        self.log.info("writing connection info to %s", path)
        write_private_json(path, cdict)

    def launch_broadcast_schedulers(self, monitor_url, children):
        shape = self.shape
        self.log.info(
            "Broadcast tree: depth=%i fanout=%i, %i relay nodes, %i leaves",
            shape.depth,
            shape.fanout,
            shape.n_nodes,
            shape.n_leaves,
        )
        for path in self.shape.nodes():
            self.specs.node(path, monitor_url)
            children.append(self.kids.add(f"relay node {node_name(path)}", partial(self._node_process, path)))

    def init_schedulers(self):
        """ipyparallel's queues, with ours in place of three (``ChildSpecs.queues``)."""
        super().init_schedulers()
        for name, (target, spec) in self.specs.queues().items():
            self.kids.replace_queue(name, target, spec)

    def launch_python_scheduler(self, name, scheduler_args, children):
        return self.kids.launch_scheduler(name, scheduler_args, children, super().launch_python_scheduler)

    def start(self):
        self.kids.start()
        self.keepers.start()
        PeriodicCallback(self.keepers.check, 1000).start()
        super().start()

    def terminate_children(self):
        if self.kids is not None:
            self.kids.stop()
        super().terminate_children()
        if self.kids is not None:
            self.kids.reap()

    def _node_process(self, path):
        spec = self.specs.nodes[tuple(path)]
        return child_process(run_node, f"RelayNode({node_name(path)})", f"ipb-node-{node_name(path)}", dict(spec=spec))


def stores() -> dict:
    """ipyparallel's record stores that ours replace: ``{theirs: ours}``."""
    from ipyparallel.controller.sqlitedb import SQLiteDB

    from .sqlstore import BroadcastSQLiteDB

    return {SQLiteDB: BroadcastSQLiteDB}


def write_private_json(path: str, content: dict) -> None:
    """``content`` as JSON at ``path``, whole or not at all, readable by its
    owner only from the first byte. ipyparallel's truncates the file, writes
    it, then restricts it: a client polling for it (a Slurm job's, a
    script's) read it empty, and another user could read it meanwhile."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.remove(tmp)  # (one a killed run left: made anew, so with these permissions)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(content, indent=2))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


def main(*args, **kwargs):
    return BroadcastController.launch_instance(*args, **kwargs)


if __name__ == "__main__":
    main()
