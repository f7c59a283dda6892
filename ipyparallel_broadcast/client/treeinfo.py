"""The client's questions to the tree itself: every node's state (a survey
up the tree in one round trip), a traced call's path, and the layout."""

from __future__ import annotations

from concurrent.futures import Future

from ..wire import protocol as P
from ..wire.topology import TreeShape, render
from .display.reprs import NodeStats, Trace, tree_html
from .display.trace import merge


class TreeLayout:
    """The tree in use: which leaf serves which engines, and the host relays
    (``hosts``: ``{label: (leaf index, engine ids)}``) with theirs; in
    Jupyter, a picture with each node's load from the survey (``nodes``)."""

    def __init__(self, shape: TreeShape, engine_ids, hosts=None, nodes=()):
        self.shape = shape
        self.depth, self.fanout = shape.depth, shape.fanout
        self.hosts = dict(hosts or {})
        hosted = {e for _, eids in self.hosts.values() for e in eids}
        self.leaves = {
            shape.leaf_index(path): eids
            for path, eids in shape.layout(e for e in engine_ids if e not in hosted).items()
        }
        self._text = render(shape, engine_ids, self.hosts)
        self.nodes = {str(n.get("host") or n.get("node")): n for n in nodes}
        for name, n in sorted(self.nodes.items()):  # the data plane: where the last big request's chunks went
            if n.get("bulk_last"):
                self._text += "\n" + chunk_path(name, n["bulk_last"])

    def __repr__(self):
        return self._text

    def _repr_html_(self):
        return tree_html(self.shape, self.leaves, self.hosts, self.nodes)


def chunk_path(leaf: str, last: dict) -> str:
    """How the last big request's chunks went from ``leaf`` to its hosts (``bulk``)."""
    hosts, k = last.get("hosts") or [], last.get("fanout") or 1
    if last.get("shape") == "two trees":
        shape = f"{leaf} -> two binary trees of {len(hosts)} hosts (even chunks, odd chunks): " + ", ".join(hosts)
    elif k == 1:
        shape = " -> ".join([leaf] + list(hosts))
    else:
        shape = f"{leaf} -> a {k}-ary tree of {len(hosts)} hosts: " + ", ".join(hosts)
    chunk = last.get("chunk") or 0
    size = "" if not chunk else f" of {chunk >> 10} KiB" if chunk % 1024 == 0 else f" of {chunk} B"
    return f"chunks of the last big request ({last.get('chunks')}{size}): {shape}"


class TreeSurveys:
    """``broadcast_stats``, ``broadcast_trace`` and ``broadcast_tree`` of ``Client``."""

    def broadcast_trace(self, msg_id: str, timeout: float = 10) -> Trace:
        """The events of a traced broadcast, in time order: the client's, each
        relay node's and each engine's (see ``ipyparallel_broadcast.client.display.trace``)."""
        if msg_id not in self._traces:
            raise KeyError(f"no trace of {msg_id!r} (not traced, or no longer kept)")
        return Trace(merge(self._traces.events(msg_id), self.broadcast_stats(timeout, trace=msg_id)))

    def broadcast_stats(self, timeout: float = 10, trace=None) -> NodeStats:
        """Every relay node's own state, gathered up the tree in one round trip:
        ``node``, ``pending`` (requests in flight), ``parked``, ``dropped``
        (bad messages refused), ``engines`` (leaves), ``rss``, ``pid``, ``busy``
        (seconds spent handling messages) and ``cpu`` (process CPU seconds).
        A node that cannot answer appears with an ``error``."""
        _ = self.tree_shape  # a clear error on a stock controller
        msg = self.session.msg(P.STATS, content={} if trace is None else dict(trace=trace))
        msg_id = msg["content"]["msg_id"] = msg["header"]["msg_id"]
        self._surveys[msg_id] = survey = Future()
        self._loop.add_callback(self._to_root, msg_id, self._root_stream.send_multipart, self.session.serialize(msg))
        try:
            return NodeStats(sorted(survey.result(timeout), key=lambda n: str(n.get("node"))))
        finally:
            self._surveys.pop(msg_id, None)
            self._root_watch.done(msg_id)

    def broadcast_tree(self, timeout: float = 10) -> TreeLayout:
        """Depth, fan-out, the engines under each leaf, and the host relays
        under the leaves with their engines (asked of the tree itself)."""
        shape, hosts = self.tree_shape, {}
        nodes = self.broadcast_stats(timeout)
        leaf_of_host = {h: n["node"] for n in nodes for h in n.get("hosts") or ()}
        for n in nodes:
            if n.get("host") in leaf_of_host:
                path = (
                    ()
                    if leaf_of_host[n["host"]] == "root"
                    else tuple(int(d) for d in leaf_of_host[n["host"]].split("."))
                )
                hosts[n["host"]] = (shape.leaf_index(path), n.get("eids") or [])
        return TreeLayout(shape, self.ids, hosts, nodes)
