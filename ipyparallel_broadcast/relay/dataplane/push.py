"""Big requests to many hosts: the data plane's push, in pipelined chunks.

A leaf with host relays sends every host its request directly (the control
plane: small, so replies, routes and liveness keep their short paths), less
the request's big buffers. Those go in chunks along a tree of the hosts, each
host relay forwarding every chunk to its own children in the tree as soon as
it has checked it (cut-through), on links of their own (``BULK`` sends: the
shell connects to each host relay's bulk socket). So the controller host's
link carries about one copy, not one per host, and a big push costs about one
copy's time on one link.

The way and the chunk size are chosen per request by the model
(``pushplan.plan_push``, on the link as timed from earlier pushes): a chain, a
k-ary tree (``plans.heap``), or two trees (Sanders, Speck and Traeff), where
even chunks go down one binary tree and odd chunks down its mirror, every
host interior in at most one, so each host's link carries about one copy.

Integrity: the envelope names the chunks' layout (``Layout``) and is signed;
every chunk is a signed message whose content carries the SHA-256 of its
bytes, checked at each host before it is forwarded or used. A host hands its
engines the request only once every chunk has arrived (``push_in``); a
chunk that comes twice (after healing) is dropped.

The leaf hashes and signs its chunks a batch per turn of its loop
(``make_more``), so the first are on the wire while the rest are made.

Healing: when the leaf loses a host relay of a plan, it sends the chunks of
each tree the host was in again straight to that host's children there
(``orphaned``); a host that gets no chunk for ``stall`` seconds fails its
engines, naming the cause.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ...wire import protocol as P
from ...wire.topology import HOST_PREFIX
from ..events import Send
from .chunks import BULK, count, digest, size, to_host
from .plans import TWO_TREES, binary, heap
from .pushplan import Gauge, PushPlan, plan_push

CHUNK_MSG = "ipb_chunk"
CHUNK = 512 << 10  # bytes per chunk of a reduce's chain (MPI's large-message segments are 512 KB)
THRESHOLD = 1 << 20  # buffers this big go in chunks
BATCH = 2 << 20  # bytes of chunks the leaf hashes and signs per turn of its loop
MAX_CHUNKS = 1 << 20  # a layout naming more is refused


@dataclass(frozen=True)
class Layout:
    """Which buffers of a request go in chunks, and their sizes:
    chunk ``j`` is bytes ``[o, o + size)`` of one buffer, buffer by buffer."""

    bufs: tuple[tuple[int, int], ...]  # (index among the request's buffers, nbytes)
    chunk: int

    @property
    def counts(self) -> list[int]:
        return [max(1, count(n, self.chunk)) for _, n in self.bufs]

    @property
    def n(self) -> int:
        return sum(self.counts)

    @property
    def nbytes(self) -> int:
        return sum(n for _, n in self.bufs)

    def locate(self, j: int) -> tuple[int, int, int]:
        """(position in ``bufs``, offset, size) of chunk ``j``."""
        for k, chunks in enumerate(self.counts):
            if j < chunks:
                return k, j * self.chunk, size(j, self.bufs[k][1], self.chunk)
            j -= chunks
        raise IndexError(j)

    def content(self) -> dict:
        return dict(bufs=[list(b) for b in self.bufs], chunk=self.chunk)

    @classmethod
    def from_content(cls, d, n_buffers: int) -> Layout:
        try:
            bufs = tuple((int(i), int(n)) for i, n in d["bufs"])
            layout = cls(bufs, int(d["chunk"]))
        except (KeyError, TypeError, ValueError) as e:
            raise P.ProtocolError(f"bad chunk layout: {e}") from e
        indices = [i for i, _ in bufs]
        if (
            layout.chunk < 1
            or not bufs
            or len(set(indices)) != len(indices)
            or not all(0 <= i < n_buffers and n >= 0 for i, n in bufs)
            or layout.n > MAX_CHUNKS
        ):
            raise P.ProtocolError(f"bad chunk layout {d!r}")
        return layout


@dataclass
class Outgoing:
    """At the leaf: a request's chunks and the plan they follow."""

    key: str  # the request's
    id: str  # the chunks' (unique across leaves: the leaf's boot and the key)
    layout: Layout
    plan: PushPlan
    trees: list[dict[object, list]]  # per tree: host key (None: the leaf) -> the hosts it feeds
    buffers: list[memoryview]  # the chunked buffers' bytes, in the order of ``layout.bufs``
    urls: dict[bytes, str]  # host -> its bulk socket
    start: float  # when its first chunks went
    messages: list[list] = field(default_factory=list)  # each chunk's signed message, made once, in order

    def chunks_of(self, t: int) -> list[list]:
        """The messages made so far of the chunks that go down tree ``t``."""
        return self.messages[t :: len(self.trees)]


class PushOut:
    """A leaf's pushes in flight: each request's plan, its chunks made as the
    loop turns, and healing around a lost host."""

    def __init__(
        self,
        codec: P.Codec,
        clock: Callable[[], float],
        chunk: int = 0,
        threshold: int = THRESHOLD,
        fanout: int = 0,
        shape: str = "auto",
    ):
        self.codec, self.clock = codec, clock
        self.chunk, self.threshold, self.fanout = chunk, threshold, fanout  # 0: chosen per request
        self.shape = shape  # "auto": chosen per request
        self.gauge = Gauge()  # the link, as this node's pushes timed it
        self.outgoing: dict[str, Outgoing] = {}  # request key -> its chunks
        self.unmade: set[str] = set()  # request keys whose chunks are still being made
        self.sent = 0  # chunks, for stats
        self.last: dict | None = None  # the last request's plan: shape, chunks, hosts in order

    def start(self, p, hosts: list[tuple[bytes, str]], boot: str) -> Outgoing | None:
        """Chunks for request ``p`` to ``hosts`` ((identity, bulk url)), if it
        has big buffers; the first sends, to the hosts the leaf feeds, are ``first_sends``."""
        if not hosts or p.stock or p.rename is not None:
            return None
        bufs = tuple((i, P.nbytes(b)) for i, b in enumerate(p.inner[5:]) if P.nbytes(b) >= self.threshold)
        if not bufs:
            return None
        plan = plan_push(len(hosts), sum(n for _, n in bufs), self.gauge.link, self.fanout, self.chunk, self.shape)
        layout = Layout(bufs, plan.chunk)
        order = [h for h, _ in hosts]
        two = plan.shape == TWO_TREES
        trees = [binary(order), binary(order[::-1])] if two else [heap(order, plan.fanout)]
        views = [memoryview(p.inner[5 + i]).cast("B") for i, _ in bufs]
        out = Outgoing(p.key, f"{boot[:12]}.{p.key}", layout, plan, trees, views, dict(hosts), self.clock())
        self.last = dict(
            shape=plan.shape,
            fanout=plan.fanout,
            chunks=layout.n,
            chunk=plan.chunk,
            link=round(self.gauge.bits_per_second),
            hosts=[h[len(HOST_PREFIX) :].decode() for h in order],
        )
        self.outgoing[p.key] = out
        return out

    def envelope(self, out: Outgoing, host: bytes, frames: list) -> tuple[dict, list]:
        """What ``host``'s request carries: the layout and the hosts it feeds
        (``to``; with two trees, ``odd``: those it feeds the odd chunks); its
        frames, less the chunked buffers."""
        chunked = {5 + i for i, _ in out.layout.bufs}
        feeds = [[[h[len(HOST_PREFIX) :].decode(), out.urls[h]] for h in tree.get(host, [])] for tree in out.trees]
        content = dict(out.layout.content(), id=out.id, to=feeds[0], **({"odd": feeds[1]} if len(feeds) > 1 else {}))
        return content, [b"" if k in chunked else f for k, f in enumerate(frames)]

    def first_sends(self, out: Outgoing) -> list[Send]:
        """The leaf's first chunks, to the hosts it feeds in their trees; the
        rest are made as the node's loop turns (``making``, ``make_more``), so
        the first go on the wire while later ones are hashed and signed."""
        return self._make(out)

    def making(self) -> float | None:
        """When chunks are next made (at once, while any are left; None: none are)."""
        return 0.0 if self.unmade else None

    def make_more(self) -> list[Send]:
        """The next chunks of each push still being made."""
        sends = []
        for key in list(self.unmade):
            out = self.outgoing.get(key)
            sends += self._make(out) if out is not None else []
            if out is None or len(out.messages) == out.layout.n:
                self.unmade.discard(key)
        return sends

    def _make(self, out: Outgoing) -> list[Send]:
        """Hash and sign the next ``BATCH`` bytes of chunks; each goes to the
        hosts the leaf feeds in its tree."""
        sends, made, trees = [], 0, len(out.trees)
        while made < BATCH and len(out.messages) < out.layout.n:
            j = len(out.messages)
            k, offset, size = out.layout.locate(j)
            data = out.buffers[k][offset : offset + size]
            message = self.codec.pack(CHUNK_MSG, dict(id=out.id, i=j, d=digest(data)), [data])
            out.messages.append(message)
            sends += [to_host(out.urls[host], message, host) for host in out.trees[j % trees][None]]
            made += size
        if len(out.messages) < out.layout.n:
            self.unmade.add(out.key)
        self.sent += len(sends)
        return sends

    def sends_for(self, out: Outgoing, hosts, t: int) -> list[Send]:
        """Tree ``t``'s chunks, to each of ``hosts`` (identities)."""
        sends = [to_host(out.urls[host], m, host) for host in hosts for m in out.chunks_of(t)]
        self.sent += len(sends)
        return sends

    def orphaned(self, host: bytes) -> list[Send]:
        """``host`` is lost: the hosts it fed, in each tree, get that tree's
        chunks from the leaf (and the link to it goes, with what it still held)."""
        urls = {out.urls[host] for out in self.outgoing.values() if host in out.urls}
        sends = [Send(BULK, [url.encode()]) for url in urls]
        for out in self.outgoing.values():
            for t, tree in enumerate(out.trees):
                feeds = tree.pop(host, None)
                if feeds:
                    tree[None] = tree[None] + feeds
                    sends += self.sends_for(out, feeds, t)
        return sends

    def release(self, p):
        """``p`` is done here: its transfers' state goes; a push that every
        engine took is timed (``gauge``)."""
        out = self.outgoing.get(p.key)
        if out is not None and not p.failed:
            self.gauge.timed(out.layout.nbytes, self.clock() - out.start, out.plan.stages, out.layout.n)
        self.done(p.key)

    def done(self, key: str):
        self.outgoing.pop(key, None)
        self.unmade.discard(key)

    def stats(self) -> dict:
        stats = dict(bulk_sent=self.sent, bulk_chunk=self.chunk)
        if self.last is not None:
            stats["bulk_last"] = self.last
        return stats
