"""The relay tree's settings, as ordinary traitlets config.

Set them as ``--BroadcastController.<name>=...`` on ``ipcontroller`` (or
``ipcluster start --controller=broadcast``), or as
``c.BroadcastController.<name>`` in a profile's config file: the controller
is a ``TreeSettings``, and traitlets reads a class's settings under the names
of its subclasses too.
"""

from __future__ import annotations

from traitlets import Bool, Enum, Float, Integer, Union, validate
from traitlets.config import Configurable

from ..relay.dataplane import pushplan, reduce_trees
from ..relay.forwarding import DEFAULT_HOST_FANOUT
from ..wire.topology import TreeShape, auto_shape

ASSUMED_ENGINES = 64  # an 'auto' tree's engine count when nobody gave one


class TreeSettings(Configurable):
    """The tree's shape, its heartbeats, and the paths big data takes."""

    # 'auto' by measurement: the root alone on 2 cores, as fast as depth 1 at 1,024
    # engines and faster on a laptop, for less of the center's CPU (results/default-tree.md)
    depth = Union(
        [Integer(), Enum(["auto"])],
        default_value="auto",
        config=True,
        help="Levels of relay nodes below the root (0: root only), or 'auto': picked for the engine "
        "count and the controller host's cores (see topology.auto_shape).",
    )
    fanout = Union(
        [Integer(), Enum(["auto"])],
        default_value="auto",
        config=True,
        help="Children per relay node (at least 2), or 'auto' (see depth).",
    )
    engines = Integer(
        None,
        allow_none=True,
        config=True,
        help="Engines the tree is sized for when depth or fanout is 'auto' (our launchers and "
        f"ipyparallel_broadcast.Cluster pass their engine count; unknown: {ASSUMED_ENGINES}).",
    )
    hosts = Integer(
        1,
        config=True,
        help="Engine hosts the tree is sized for when depth or fanout is 'auto'. Engines on "
        "hosts other than the controller's reach it through one host relay per host "
        "(see relay.hostshell), and the first leaf sends a call to at most host_fanout of "
        "them, which pass it on: the tree is sized for that many children, not engines.",
    )
    ping_interval = Float(
        0.5,
        config=True,
        help="Seconds between a relay node's pings to its children (past 16 children, further apart "
        "in proportion, at most node_timeout / 4).",
    )
    host_fanout = Integer(
        DEFAULT_HOST_FANOUT,
        min=0,
        config=True,
        help="A leaf sends a call to at most this many host relays; each passes it on to at most as "
        "many others, and merges their outcomes with its own (a tree across hosts, made per call, as "
        "Slurm's TreeWidth). 0: the leaf sends to every host relay. Calls with big data, reductions, "
        "scatters and stock clients' calls go to every host relay from the leaf.",
    )
    node_timeout = Float(
        10.0,
        config=True,
        help="A child relay node silent for this many seconds is lost: what waits on it fails. "
        "(A node that dies is noticed at the next ping: its link closes.)",
    )
    engine_pause_limit = Float(
        60.0,
        config=True,
        help="Seconds an engine behind a host relay may be silent while its process lives "
        "(paused: a debugger, swap, a suspended job) before it is given up; an engine whose "
        "process is gone is given up at once (see relay.enginehearts).",
    )
    heap_trim_interval = Float(
        10.0,
        config=True,
        help="Seconds between a relay node's returns of freed heap to the OS (glibc's "
        "malloc_trim), while messages flow, and once more that long after the last: its RSS "
        "stays flat over millions of calls, and a quiet node holds only its live heap. 0: never.",
    )
    hub_records = Bool(
        True,
        config=True,
        help="Keep per-engine task records of broadcasts in the hub, as for DirectView "
        "(rc.db_query, result_status, queue_status). The root copies each request and "
        "leaves copy each engine reply to the hub.",
    )
    shared_memory = Bool(
        True,
        config=True,
        help="Send request buffers of 1 MiB or more to the engines of a relay's own host "
        "once, through /dev/shm, mapped copy-on-write by each engine (see host.shm). Off: each "
        "engine gets its own copy over ZeroMQ.",
    )
    shared_memory_threshold = Integer(
        1 << 20,
        config=True,
        help="The smallest request buffer, in bytes, that shared_memory sends once per host.",
    )
    host_chunks = Bool(
        True,
        config=True,
        help="Send a request's big buffers to host relays in pipelined chunks, host to host "
        "along a tree of the hosts (see relay.dataplane), instead of one whole copy from a leaf to each host.",
    )
    host_chunk_size = Integer(
        0,
        config=True,
        help="Bytes per chunk (host_chunks); 0 picks it per push from the alpha-beta model, on the link "
        "as the leaf timed its earlier pushes (a reduce's chunks are then 512 KiB).",
    )
    host_chunk_threshold = Integer(
        1 << 20, config=True, help="The smallest request buffer, in bytes, that goes in chunks (host_chunks)."
    )
    host_chunk_fanout = Integer(
        0,
        config=True,
        help="How many hosts each host feeds chunks to: 1 is a chain; 0 picks it per request "
        "from the alpha-beta model (relay.dataplane.model).",
    )
    host_push_shape = Enum(
        list(pushplan.SHAPES),
        "auto",
        config=True,
        help="How a push's chunks go between host relays: a 'chain' of the hosts, or 'two trees' (Sanders, "
        "Speck and Traeff: even chunks down one binary tree, odd chunks down its mirror); 'auto' picks per "
        "request from the alpha-beta model, a chain, a k-ary tree (host_chunk_fanout) or two trees.",
    )
    host_reduce_shape = Enum(
        list(reduce_trees.SHAPES),
        "auto",
        config=True,
        help="How a reduce's big values go between host relays to their leaf: a 'chain' of the hosts, "
        "or 'two trees' (Sanders, Speck and Traeff: each half of the value up a binary tree); "
        "'auto' picks per request from the alpha-beta model (relay.dataplane.pushplan).",
    )
    node_restarts = Integer(
        10,
        config=True,
        help="A dead child process of the controller (a relay node, a queue, the task scheduler, the heart "
        "monitor) is restarted, unless it was restarted this many times within the last "
        "node_restart_window seconds (a crash loop): then the controller gives up on it.",
    )
    node_restart_window = Float(
        60.0,
        config=True,
        help="Seconds over which node_restarts are counted (see node_restarts).",
    )

    @validate("depth")
    def _valid_depth(self, proposal):
        if proposal.value != "auto":
            TreeShape(proposal.value, 2)
        return proposal.value

    @validate("fanout")
    def _valid_fanout(self, proposal):
        if proposal.value != "auto":
            TreeShape(0, proposal.value)
        return proposal.value

    auto_inputs = None  # engines and cores an 'auto' shape was picked for

    @property
    def shape(self) -> TreeShape:
        """The tree; an 'auto' depth or fanout is decided (once) here."""
        if "auto" in (self.depth, self.fanout):
            from ..engine.compose.host import cpu_count

            fixed = [None if v == "auto" else v for v in (self.depth, self.fanout)]
            engines = self.engines
            if engines is None:  # our launchers pass it; ipyparallel's (ssh, mpi, ...) do not
                engines = ASSUMED_ENGINES
                self.log.warning(
                    "Broadcast tree 'auto' without an engine count: sized for %i engines. "
                    "Pass --BroadcastController.engines=N (the broadcast launchers do).",
                    engines,
                )
            # engines on other hosts sit behind one relay a host, all under the first leaf,
            # which sends a call to at most host_fanout of them (``relay.forwarding``)
            served = min(self.hosts, self.host_fanout or self.hosts) if self.hosts > 1 else engines
            shape = auto_shape(served, cpu_count(), *fixed)
            self.auto_inputs = dict(engines=engines, cores=cpu_count())
            if self.hosts > 1:
                self.auto_inputs.update(hosts=self.hosts, host_fanout=self.host_fanout)
            self.log.info(
                "Broadcast tree 'auto' for %i %s on %i cores: depth=%i fanout=%i",
                served,
                "host relays a call goes to" if self.hosts > 1 else "engines",
                cpu_count(),
                shape.depth,
                shape.fanout,
            )
            self.depth, self.fanout = shape.depth, shape.fanout
        return TreeShape(self.depth, self.fanout)
