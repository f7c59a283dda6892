"""The client's questions to the tree itself: every node's state (a survey
up the tree in one round trip), a traced call's path, and the layout."""

from __future__ import annotations

from concurrent.futures import Future
from functools import wraps

from ..wire import protocol as P
from ..wire.topology import TreeShape, render
from .display.reprs import NodeStats, Trace, tree_html
from .display.trace import merge


class TreeLayout:
    """The tree in use: which leaf serves which engines, and the host relays
    (``hosts``: ``{label: (leaf index, engine ids)}``) with theirs; in
    Jupyter, a picture with each node's load from the survey (``nodes``)."""

    def __init__(self, shape: TreeShape, engine_ids, hosts=None, nodes=(), controller=None):
        self.shape = shape
        self.controller = controller or {}  # its pid and keeper, as its beats say (``kept``)
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
        kept = self.kept
        return self._text if kept is None else f"{self._text}\n{kept}"

    @property
    def kept(self) -> str | None:
        """Who keeps the controller (restarts it if it dies); None if its beats do not say."""
        pid, keeper = self.controller.get("pid"), self.controller.get("keeper", False)
        if keeper is False:
            return None
        if keeper is None:
            return f"controller pid {pid}: WITHOUT a keeper (if it dies, it is not restarted)"
        return f"controller pid {pid}, kept by pid {keeper}"

    def _repr_html_(self):
        kept = self.kept
        return tree_html(self.shape, self.leaves, self.hosts, self.nodes) + (f"<p>{kept}</p>" if kept else "")


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
    """A part of our Client: its questions to the tree (the Client's
    ``broadcast_stats``, ``broadcast_trace`` and ``broadcast_tree``), and the
    surveys waiting for their answer, which it owns; ``client`` is the Client
    whose broadcast socket and traces it uses."""

    def __init__(self, client):
        self.client = client
        self.waiting: dict[str, Future] = {}  # stats msg_id -> future of the node list

    @staticmethod
    def asked(name: str):
        """The Client's method ``broadcast_<name>``: this part's ``name``, asked of the client's part."""
        method = getattr(TreeSurveys, name)

        @wraps(method)
        def ask(client, *args, **kwargs):
            return method(client._tree_surveys, *args, **kwargs)

        ask.__name__ = ask.__qualname__ = f"broadcast_{name}"
        return ask

    def answered(self, msg_id, nodes) -> None:
        """The root's answer to survey ``msg_id`` (I/O thread)."""
        survey = self.waiting.get(msg_id)
        if survey is not None and not survey.done():
            survey.set_result(nodes)

    def lost(self, msg_id, why: str) -> None:
        """Survey ``msg_id`` cannot come back (I/O thread)."""
        survey = self.waiting.get(msg_id)
        if survey is not None and not survey.done():
            survey.set_exception(ConnectionError(why))

    def trace(self, msg_id: str, timeout: float = 10) -> Trace:
        """The events of a traced broadcast, in time order: the client's, each
        relay node's and each engine's (see ``ipyparallel_broadcast.client.display.trace``)."""
        traces = self.client._traces
        if msg_id not in traces:
            raise KeyError(f"no trace of {msg_id!r} (not traced, or no longer kept)")
        return Trace(merge(traces.events(msg_id), self.stats(timeout, trace=msg_id)))

    def stats(self, timeout: float = 10, trace=None) -> NodeStats:
        """Every relay node's own state, gathered up the tree in one round trip:
        ``node``, ``pending`` (requests in flight), ``parked``, ``dropped``
        (bad messages refused), ``engines`` (leaves), ``rss``, ``pid``, ``busy``
        (seconds spent handling messages) and ``cpu`` (process CPU seconds).
        A node that cannot answer appears with an ``error``."""
        client = self.client
        _ = client.tree_shape  # a clear error on a stock controller
        msg = client.session.msg(P.STATS, content={} if trace is None else dict(trace=trace))
        msg_id = msg["content"]["msg_id"] = msg["header"]["msg_id"]
        self.waiting[msg_id] = survey = Future()
        send = client._root_stream.send_multipart
        client._loop.add_callback(client._replies.to_root, msg_id, send, client.session.serialize(msg))
        try:
            return NodeStats(sorted(survey.result(timeout), key=lambda n: str(n.get("node"))))
        finally:
            self.waiting.pop(msg_id, None)
            client._root_watch.done(msg_id)

    def tree(self, timeout: float = 10) -> TreeLayout:
        """Depth, fan-out, the engines under each leaf, and the host relays
        under the leaves with their engines (asked of the tree itself)."""
        shape, hosts = self.client.tree_shape, {}
        nodes = self.stats(timeout)
        leaf_of_host = {h: n["node"] for n in nodes for h in n.get("hosts") or ()}
        for n in nodes:
            if n.get("host") in leaf_of_host:
                path = (
                    ()
                    if leaf_of_host[n["host"]] == "root"
                    else tuple(int(d) for d in leaf_of_host[n["host"]].split("."))
                )
                hosts[n["host"]] = (shape.leaf_index(path), n.get("eids") or [])
        watch = self.client._watch
        return TreeLayout(shape, self.client.ids, hosts, nodes, dict(pid=watch.pid, keeper=watch.keeper))
