"""An in-memory tree of RelayNodes with fake engines: no sockets, no processes.

Routes each ``Send`` to the node or engine it names, the way the zmq shell
would, so the pure core can be tested end to end.
"""

from __future__ import annotations

import json
from collections import Counter, deque

from jupyter_client.session import Session

from ipyparallel_broadcast.relay.dataplane.chunks import BULK
from ipyparallel_broadcast.relay.events import DOWN, HUB, JOINED, UP
from ipyparallel_broadcast.relay.forwarding import DEFAULT_HOST_FANOUT, REQUEST_MARK, outbound
from ipyparallel_broadcast.relay.node import RelayNode
from ipyparallel_broadcast.wire import bundles as B
from ipyparallel_broadcast.wire import protocol as P
from ipyparallel_broadcast.wire.topology import HOST_PREFIX, TreeShape, host_ident, node_identity


def engine_uuid(eid: int) -> str:
    return f"uuid-{eid:04d}"


class TreeSim:
    def __init__(
        self,
        depth,
        fanout,
        engine_ids,
        key=b"secret",
        hosts=None,
        coalesce=False,
        bulk=None,
        store=None,
        host_fanout=DEFAULT_HOST_FANOUT,
    ):
        """``hosts``: {label: (leaf index, [engine ids])}: those engines sit
        behind a host relay under that leaf (keyed ``("h", label)``).
        ``coalesce``: nodes hold streamed outcomes until ``drain()``, as their
        shells do until every waiting message is read.
        ``bulk``: the nodes' chunk options; host relays then have bulk sockets,
        and ``chunks_at[host]`` counts the chunks each got.
        ``store``: a node's key -> the shared-memory store it is built with (or None).
        ``host_fanout``: the leaves' (``relay.forwarding``)."""
        self.coalesce, self.bulk, self.store = coalesce, bulk, store or (lambda key: None)
        self.host_fanout = host_fanout
        self.finished = []  # each request a node finished: the phases it went through (relay.state)
        self.bulk_urls = {}  # url -> ("h", label)
        self.chunks_at = {}
        self.closed_links = []  # hosts whose bulk link a node closed
        self.walled = set()  # hosts whose chunk socket no other host reaches (a firewall)
        self.requests_sent = Counter()  # node -> requests it sent (to children, host relays or engines)
        self.shape = TreeShape(depth, fanout)
        self.session = Session(key=key)
        self.codec = P.Codec(self.session)
        self.now = 0.0  # the nodes' clock; advance with tick()
        self.key = key
        self.nodes = {path: self._new_node(path) for path in self.shape.nodes()}
        self.down_nodes = {}  # path -> "dead" (its link is closed) or "hung" (silent)
        self.node_inbox = {path: [] for path in self.nodes}  # requests each node got
        self.answer_with = None  # eid, request -> (content, buffers); default: ok, no buffers
        self.engines = {eid: engine_uuid(eid) for eid in engine_ids}
        self.hub_engines = dict(self.engines)
        for path, node in self.nodes.items():
            if node.is_leaf:
                node.on_registry({e: u for e, u in self.engines.items() if self.shape.serves(path, e)})
        self.client_inbox = []  # frames the root sent up
        self.engine_inbox = {eid: [] for eid in engine_ids}  # requests engines got
        self.held = {}  # eid -> requests an engine has not answered (hold=True)
        self.hold = set()  # engines that do not answer yet
        self.queue = deque()
        self.routing = False  # sends are being routed (one loop at a time: no recursion per engine)
        self.hub_lookups = 0
        self.engine_codecs = {}
        self.joined = []  # tokens host relays were told their route is complete
        self.host_leaf = {}  # ("h", label) -> the leaf path it hangs under
        for label, (leaf, eids) in (hosts or {}).items():
            self.add_host(label, leaf, eids)

    def add_host(self, label, leaf_index, eids):
        """A host relay comes up under a leaf, and its engines join it."""
        key = ("h", label)
        leaf = self.host_leaf[key] = self.shape.leaf_path(leaf_index)
        node = self.nodes[key] = RelayNode(
            P.Codec(Session(key=self.key)),
            self.shape,
            leaf,
            clock=lambda: self.now,
            host=label,
            bulk=self.bulk,
            store=self.store(key),
            coalesce=self.coalesce,
        )
        self._watch(node)
        if self.bulk is not None:
            node.heartbeats.links(bulk_url=f"tcp://{label}:5555")
            self.bulk_urls[node.heartbeats.bulk_url] = key
            self.chunks_at.setdefault(key, 0)
        self.node_inbox[key] = []
        self._run(node, node.heartbeats.hello(), key)
        for eid in eids:
            self._run(node, node.on_join([(eid, self.engines[eid], eid, None)]), key)
        return node

    def _new_node(self, path):
        codec = P.Codec(Session(key=self.key))
        more = dict(bulk=self.bulk, store=self.store(path), coalesce=self.coalesce, host_fanout=self.host_fanout)
        node = RelayNode(codec, self.shape, path, clock=lambda: self.now, **more)
        return self._watch(node)

    def _watch(self, node):
        """Keep each finished request's phases (``finished``), as the node ends it."""
        node.inflight.on_done.append(lambda p: self.finished.append(list(p.state.history)))
        return node

    def drain(self):
        """Every node's shell has read all that waited: held outcomes go up,
        deepest nodes first (host relays, then by depth)."""

        def depth(key):
            return -(len(self.host_leaf[key]) + 1) if key in self.host_leaf else -len(key)

        for path in sorted(self.nodes, key=depth):
            self._run(self.nodes[path], self.nodes[path].on_drained(), path)

    def restart(self, path):
        """Node ``path`` comes back as a new process (new state, new boot) and says hello."""
        self.down_nodes.pop(path, None)
        if path in self.host_leaf:  # a host relay: its engines join it again
            old = self.nodes[path]
            return self.add_host(path[1], self.shape.leaf_index(self.host_leaf[path]), list(old.engines))
        node = self.nodes[path] = self._new_node(path)
        if node.is_leaf:
            node.on_registry({e: u for e, u in self.engines.items() if self.shape.serves(path, e)})
        self._run(node, node.heartbeats.hello(), path)

    # -- client side --------------------------------------------------------
    def request(self, targets, stream=False, inner=None, route=(b"client-1",), each=None, **extra):
        """Send a request; ``each``: every target's own buffers, in order;
        ``extra``: more request fields (``batch``, ``reduce``)."""
        inner_msg = self.session.msg("apply_request", content={}, metadata={})
        inner = inner or self.session.serialize(inner_msg)[1:] + [b"payload"]
        content = P.request_content(inner_msg["header"]["msg_id"], targets, P.STREAM if stream else P.COALESCE, **extra)
        if each is not None:
            content["each"] = [len(b) for b in each]
            inner = inner + [b for own in each for b in own]
        frames = list(route) + self.codec.pack(P.REQUEST, content, inner)
        self.node_inbox[()].append(frames)
        self._run(self.nodes[()], self.nodes[()].on_up(frames), ())
        return inner_msg["header"]["msg_id"]

    def outcomes(self):
        """(replies by eid, failures by eid, number of client messages)."""
        replies, failures = {}, {}
        for frames in self.client_inbox:
            _, body = P.split_idents(frames)
            for what, item in B.iter_bundle(self.codec, self.codec.unpack(body)):
                if what in ("reply", "parsed"):
                    reply = self.codec.unpack(item) if what == "reply" else item
                    eid = reply["content"]["eid"]
                    assert eid not in replies and eid not in failures
                    replies[eid] = reply
                else:
                    assert item[0] not in replies and item[0] not in failures
                    failures[item[0]] = item
        return replies, failures, len(self.client_inbox)

    # -- engines ------------------------------------------------------------
    def _engine_receive(self, leaf_path, frames):
        uuid = P.as_bytes(frames[0]).decode()
        eid = next((e for e, u in self.engines.items() if u == uuid), None)
        if eid is None:  # a dead engine: the shell's EHOSTUNREACH
            node = self.nodes[leaf_path]
            self.queue.extend((leaf_path, s) for s in node.on_engine_lost(uuid, "is not connected"))
            return
        self.engine_inbox[eid].append(frames)
        if eid in self.hold:
            self.held.setdefault(eid, []).append((leaf_path, frames))
        else:
            self.answer(eid, leaf_path, frames)

    def answer(self, eid, leaf_path, frames):
        idents, body = P.split_idents(frames[1:])
        if eid not in self.engine_codecs:  # each engine has its own session
            self.engine_codecs[eid] = P.Codec(Session(key=self.session.key))
        try:
            request = self.engine_codecs[eid].unpack(body)
        except P.ProtocolError:
            return  # a real engine drops what it cannot read, and never answers
        content, buffers = {"status": "ok", "eid": eid}, []
        if self.answer_with is not None:
            content, buffers = self.answer_with(eid, request)
        reply = self.session.msg(
            "apply_reply",
            content=content,
            parent=request["header"],
            metadata={"engine": self.engines[eid]},
        )
        out = [self.engines[eid].encode()] + idents + self.session.serialize(reply) + list(buffers)
        self._run(self.nodes[leaf_path], self.nodes[leaf_path].on_down(out), leaf_path)

    def request_answered_in(self, order, targets, **extra):
        """A request whose engines answer one by one, in ``order``."""
        self.hold.update(targets)
        self.request(targets, **extra)
        for eid in order:
            self.release(eid)

    def release(self, eid):
        self.hold.discard(eid)
        for leaf_path, frames in self.held.pop(eid, []):
            self.answer(eid, leaf_path, frames)

    def tick(self, seconds):
        """Let time pass; nodes send what their timers owe."""
        self.now += seconds
        for path, node in self.nodes.items():
            self._run(node, node.on_tick(), path)

    def wait(self, seconds):
        """Let time pass in ping intervals: live nodes keep answering."""
        step = self.nodes[()].ping_interval
        for _ in range(int(seconds / step) + 1):
            self.tick(step)

    def kill(self, eid):
        """The hub notices engine eid died; its leaf hears of it."""
        uuid = self.engines.pop(eid)
        self.hub_engines.pop(eid, None)
        self.held.pop(eid, None)
        for path, node in list(self.nodes.items()):
            if node.is_leaf and not node.host:  # host relays hear of it from their leaf
                self._run(node, node.on_engine_lost(uuid), path)

    # -- routing ------------------------------------------------------------
    def _run(self, node, sends, path):
        self.queue.extend((path, s) for s in sends)
        if self.routing:  # (an engine answering while its request is routed: the loop below takes it)
            return
        self.routing = True
        try:
            self._route_all()
            while making := [p for p, n in self.nodes.items() if p not in self.down_nodes and n.big.push_out.unmade]:
                for p in making:  # a push's chunks still to make: the shell's next loop turns make them
                    self.queue.extend((p, s) for s in self.nodes[p].big.push_out.make_more())
                self._route_all()
        finally:
            self.routing = False

    def _route_all(self):
        while self.queue:
            path, send = self.queue.popleft()
            node = self.nodes[path]
            if path in self.down_nodes:
                continue  # a dead or hung node sends nothing
            if node.host:  # as its shell: outcomes of a call passed on go back the way it came
                send = outbound(send)
            if send.socket in (DOWN, BULK) and any(REQUEST_MARK in P.as_bytes(f) for f in send.frames[:6]):
                self.requests_sent[path] += 1
            if send.socket == UP:
                if node.is_root:
                    self.client_inbox.append(send.frames)
                elif node.host:
                    parent = self.host_leaf[path]
                    frames = [host_ident(node.host)] + send.frames
                    self.queue.extend((parent, s) for s in self.nodes[parent].on_down(frames))
                else:
                    parent = path[:-1]
                    frames = [node_identity(path)] + send.frames
                    self.queue.extend((parent, s) for s in self.nodes[parent].on_down(frames))
            elif send.socket == BULK:  # a chunk, to a host relay's bulk socket
                host = self.bulk_urls[P.as_bytes(send.frames[0]).decode()]
                if len(send.frames) == 1:  # the link to a lost host closed
                    self.closed_links.append(host)
                    continue
                if host in self.down_nodes or (host in self.walled and node.host):
                    continue
                self.chunks_at[host] += 1
                feeder = host_ident(node.host) if node.host else b"feeder"  # (a host relay's feeds say who it is)
                self.queue.extend((host, s) for s in self.nodes[host].on_chunk([feeder] + send.frames[2:]))
            elif send.socket == JOINED:
                self.joined.extend((path, who) for who in send.frames)
            elif send.socket == DOWN and node.is_leaf and P.as_bytes(send.frames[0]).startswith(HOST_PREFIX):
                host = ("h", P.as_bytes(send.frames[0])[len(HOST_PREFIX) :].decode())
                if self.down_nodes.get(host) == "dead":  # the shell's EHOSTUNREACH
                    self.queue.extend((path, s) for s in node.on_child_lost(send.frames[0], "is down"))
                    continue
                if host in self.down_nodes:
                    continue
                self.node_inbox[host].append(send.frames[1:])
                self.queue.extend((host, s) for s in self.nodes[host].on_up(send.frames[1:]))
            elif send.socket == DOWN:
                if node.is_leaf:
                    self._engine_receive(path, send.frames)
                else:
                    digit = node.children.key_of(send.frames[0])
                    child = path + (digit,)
                    if self.down_nodes.get(child) == "dead":  # the shell's EHOSTUNREACH
                        self.queue.extend((path, s) for s in node.on_child_lost(digit, "is down"))
                        continue
                    if child in self.down_nodes:
                        continue
                    self.node_inbox[child].append(send.frames[1:])
                    self.queue.extend((child, s) for s in self.nodes[child].on_up(send.frames[1:]))
            elif send.socket == HUB:
                self.hub_lookups += 1
                table = {e: u for e, u in self.hub_engines.items() if self.shape.serves(path, e)}
                self.queue.extend((path, s) for s in node.on_registry(table))

    def pending_total(self):
        return sum(len(n.pending) for n in self.nodes.values())


def stock_request(sim, targets, coalescing, route=(b"stock-client",)):
    """Send what ipyparallel's own BroadcastView sends; return its msg_id."""
    msg = sim.session.msg(
        "apply_request",
        content={},
        metadata=dict(
            targets=[[engine_uuid(e), e] for e in targets],
            is_broadcast=True,
            is_coalescing=coalescing,
        ),
    )
    frames = list(route) + sim.session.serialize(msg) + [b"payload"]
    root = sim.nodes[()]
    sim._run(root, root.on_up(frames), ())
    return msg["header"]["msg_id"]


def frames_bytes(frames) -> list[bytes]:
    """A message's frames as bytes, a request's joined small frames split again (``protocol.join_small``)."""
    frames = [P.as_bytes(f) for f in frames]
    delim = P.DELIM if isinstance(P.DELIM, bytes) else P.DELIM.encode()
    if delim in frames:
        at = frames.index(delim)
        content = json.loads(frames[at + 5]) if len(frames) > at + 5 else None
        if isinstance(content, dict) and content.get(P.JOINED):
            return frames[: at + 6] + [bytes(b) for b in P.split_joined(content[P.JOINED], frames[at + 6 :])]
    return frames
