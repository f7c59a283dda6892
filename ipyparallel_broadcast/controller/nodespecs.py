"""What each process the controller starts is told, and what its connection
files say of the tree: a relay node's spec (its place, its links, the
session's key, the tree's timing and data plane), the specs of the queues
ours put in place of ipyparallel's, and the connection files' tree entry.
Read from the controller's settings and addresses; nothing here starts a
process (``children`` does)."""

from __future__ import annotations

import os
import secrets
import sys

from ipyparallel.util import disambiguate_url

from ..wire.protocol import PROTOCOL_VERSION
from ..wire.topology import node_name
from .iopubrelay import run_iopub_relay
from .queues import run_router_queue


class ChildSpecs:
    """The specs, made from ``app`` (the ``BroadcastController``: its tree
    settings, session, urls and curve keys), which it only reads."""

    def __init__(self, app):
        self.app = app
        self.nodes: dict[tuple, dict] = {}  # path -> the spec its process is started with
        self._links: dict[tuple, str] | None = None  # inner node -> its down link, made at first use

    @property
    def internal_urls(self) -> dict[tuple, str]:
        if self._links is None:
            shape = self.app.shape
            inner = [path for path in shape.nodes() if not shape.is_leaf(path)]
            if sys.platform.startswith("linux"):  # abstract unix sockets: no file, gone with the process
                tag = f"ipb-{os.getpid()}-{secrets.token_hex(4)}"
                self._links = {path: f"ipc://@{tag}-{node_name(path)}" for path in inner}
            else:
                self._links = {path: f"tcp://127.0.0.1:{self.app.next_port()}" for path in inner}
        return self._links

    def tree_info(self) -> dict:
        """The connection files' tree entry: clients read the shape; host
        relays, which engines start, run with the tree's timing and data plane."""
        app = self.app
        info = dict(self._tree(), protocol=PROTOCOL_VERSION, pause_limit=app.engine_pause_limit)
        if app.auto_inputs:  # what an 'auto' shape was picked for
            info["auto"] = app.auto_inputs
        return info

    def _tree(self) -> dict:
        """What every relay runs with: the shape, its timing, shared memory and the data plane."""
        app, shape = self.app, self.app.shape
        return dict(
            depth=shape.depth,
            fanout=shape.fanout,
            ping_interval=app.ping_interval,
            node_timeout=app.node_timeout,
            shm=app.shared_memory,
            shm_threshold=app.shared_memory_threshold,
            bulk=self.bulk(),
        )

    def bulk(self) -> dict:
        """The data plane's settings, for every relay (host relays too)."""
        app = self.app
        if not app.host_chunks:
            return dict(threshold=1 << 62)
        spec = dict(chunk=app.host_chunk_size, threshold=app.host_chunk_threshold, fanout=app.host_chunk_fanout)
        return dict(spec, reduce=app.host_reduce_shape, push=app.host_push_shape)

    def node(self, path: tuple, monitor_url: str) -> dict:
        app, shape, session = self.app, self.app.shape, self.app.session
        spec = dict(
            self._tree(),
            **self._session(),
            path=list(path),
            digest_history_size=session.digest_history_size,
            log_level=app.log_level,
            trim_interval=app.heap_trim_interval,
            host_fanout=app.host_fanout,
        )
        if app.hub_records:
            spec["monitor_url"] = monitor_url
        spec["up_url"] = self.internal_url(path[:-1]) if path else app.client_url("broadcast")
        if shape.is_leaf(path):
            spec["down_url"] = app.engine_url("broadcast", index=shape.leaf_index(path))
            spec["notification_url"] = disambiguate_url(app.client_url("notification"))
            spec["registration_url"] = disambiguate_url(app.client_url("registration"))
        else:
            spec["down_url"] = self.internal_url(path)
        spec.update(self._curve(server=True))
        self.nodes[tuple(path)] = spec
        return spec

    def internal_url(self, path) -> str:
        """A link between two relay nodes, all on this host: a unix socket
        where there are abstract ones (half the copying of loopback TCP for a
        large bundle: 2.2 against 4.6 ms for 8 MB here), loopback TCP elsewhere."""
        return self.internal_urls[tuple(path)]

    def queues(self) -> dict[str, tuple]:
        """ipyparallel's queue name -> (our process's target, its spec): IOPub
        (a hello for each client whose subscription is live, ``iopubrelay``),
        mux and control (a malformed message dropped, ``queues``). Same
        sockets, same monitor copies."""
        app = self.app
        common = dict(monitor_url=disambiguate_url(app.monitor_url), **self._curve(server=False))
        iopub = dict(common, engine_url=app.engine_url("iopub"), client_url=app.client_url("iopub"), **self._session())
        ours = {"IOPubScheduler": (run_iopub_relay, iopub)}
        for name, channel in (("DirectScheduler", "mux"), ("ControlScheduler", "control")):
            prefix = b"" if channel == "mux" else b"control"  # ipyparallel's names, as the hub reads them
            spec = dict(
                common,
                in_url=app.client_url(channel),
                out_url=app.engine_url(channel),
                in_identity=f"{channel}_in".encode(),
                out_identity=f"{channel}_out".encode(),
                in_prefix=b"in" + prefix,
                out_prefix=b"out" + prefix,
            )
            ours[name] = (run_router_queue, spec)
        return ours

    def _session(self) -> dict:
        """The session a child signs and checks with (its key, scheme and packers)."""
        session = self.app.session
        return dict(
            key=session.key.decode("ascii"),
            signature_scheme=session.signature_scheme,
            packer=session.packer,
            unpacker=session.unpacker,
        )

    def _curve(self, server: bool) -> dict:
        app = self.app
        if not app.enable_curve:
            return {}
        keys = dict(curve_secretkey=app.curve_secretkey, curve_publickey=app.curve_publickey)
        return dict(keys, curve_serverkey=app.curve_publickey) if server else keys
