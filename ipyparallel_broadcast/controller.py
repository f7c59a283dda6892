"""``python -m ipyparallel_broadcast.controller``: ipcontroller with our relay tree.

Everything but broadcast is ipyparallel's own: hub, registration, heartbeats,
mux, control, task and IOPub queues. In place of its broadcast schedulers we
start one process per node of a tree of ``depth`` levels and ``fanout``
children per node; ``fanout ** depth`` leaves each serve the engines whose id
is their index modulo the number of leaves.
"""

from __future__ import annotations

from multiprocessing import Process

from traitlets import Integer, default, validate

from ipyparallel.controller.app import IPController, aliases as ipp_aliases
from ipyparallel.util import disambiguate_url

from .protocol import PROTOCOL_VERSION, TREE_KEY
from .schedulers.node import run_node
from .topology import TreeShape, node_name

aliases = dict(ipp_aliases)
aliases.update(depth="BroadcastController.depth", fanout="BroadcastController.fanout")


class BroadcastController(IPController):
    # name stays "ipcontroller": profiles' ipcontroller_config.py applies as usual
    description = __doc__
    aliases = aliases

    depth = Integer(1, config=True, help="Levels of relay nodes below the root (0: root only).")
    fanout = Integer(2, config=True, help="Children per relay node (at least 2).")

    @validate("depth")
    def _valid_depth(self, proposal):
        TreeShape(proposal.value, 2)
        return proposal.value

    @validate("fanout")
    def _valid_fanout(self, proposal):
        TreeShape(0, proposal.value)
        return proposal.value

    @property
    def shape(self) -> TreeShape:
        return TreeShape(self.depth, self.fanout)

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
        heartbeat = self.config.HeartMonitor
        for name, value in self.HEARTBEAT_DEFAULTS.items():
            if name not in heartbeat:  # what the user configured wins
                heartbeat[name] = value
        super().init_hub()
        self.internal_ports = {
            path: self.next_port() for path in self.shape.nodes() if not self.shape.is_leaf(path)
        }

    def save_connection_dict(self, fname, cdict):
        """Tell clients the tree's shape in the client connection file."""
        if fname == self.client_json_file:
            cdict = dict(cdict)
            cdict[TREE_KEY] = dict(depth=self.depth, fanout=self.fanout, protocol=PROTOCOL_VERSION)
        return super().save_connection_dict(fname, cdict)

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
            log_level=self.log_level,
        )
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
        return f"tcp://127.0.0.1:{self.internal_ports[path]}"

    def launch_broadcast_schedulers(self, monitor_url, children):
        self.log.info(
            "Broadcast tree: depth=%i fanout=%i, %i relay nodes, %i leaves",
            self.depth,
            self.fanout,
            self.shape.n_nodes,
            self.shape.n_leaves,
        )
        for path in self.shape.nodes():
            children.append(
                Process(
                    target=run_node,
                    kwargs=dict(spec=self.node_spec(path, monitor_url)),
                    name=f"RelayNode({node_name(path)})",
                    daemon=True,
                )
            )


def main(*args, **kwargs):
    return BroadcastController.launch_instance(*args, **kwargs)


if __name__ == "__main__":
    main()
