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
(``choice.plan_push``, on the link as timed from earlier pushes): a chain, a
k-ary tree (``plans.heap``), or two trees (Sanders, Speck and Traeff), where
even chunks go down one binary tree and odd chunks down its mirror, every
host interior in at most one, so each host's link carries about one copy.

Integrity: the envelope names the chunks' layout (``Layout``) and is signed;
every chunk is a signed message whose content carries the SHA-256 of its
bytes, checked at each host before it is forwarded or used. A host hands its
engines the request only once every chunk has arrived (``Incoming``); a
chunk that comes twice (after healing) is dropped.

Healing: when the leaf loses a host relay of a plan, it sends the chunks of
each tree the host was in again straight to that host's children there
(``orphaned``); a host that gets no chunk for ``stall`` seconds fails its
engines, naming the cause.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from ...wire import protocol as P
from ...wire.topology import HOST_PREFIX, host_ident
from ..events import Send
from .choice import Gauge, PushPlan, plan_push
from .chunks import BULK, Assembly, checked, count, digest, size, to_host
from .plans import TWO_TREES, binary, heap

log = logging.getLogger(__name__)

CHUNK_MSG = "ipb_chunk"
CHUNK = 512 << 10  # bytes per chunk of a reduce's chain (MPI's large-message segments are 512 KB)
THRESHOLD = 1 << 20  # buffers this big go in chunks
MAX_CHUNKS = 1 << 20  # a layout naming more is refused
EARLY_LIMIT = 256 << 20  # bytes of chunks held for envelopes not yet here


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

    id: str
    layout: Layout
    plan: PushPlan
    trees: list[dict[object, list]]  # per tree: host key (None: the leaf) -> the hosts it feeds
    messages: list[list]  # each chunk's signed message, made once
    urls: dict[bytes, str]  # host -> its bulk socket
    start: float  # when its first chunks went

    def chunks_of(self, t: int) -> list[list]:
        """The messages of the chunks that go down tree ``t``."""
        return self.messages[t :: len(self.trees)]


@dataclass
class Incoming:
    """At a host relay: a request's chunks, assembled, and where they go on."""

    id: str
    layout: Layout
    to: list[list[tuple[str, str]]]  # per tree, the hosts this one feeds: (label, url)
    key: str | None  # the request it completes (None: it was done here already)
    last: float  # when a chunk last arrived
    buffers: list = field(default_factory=list)  # writable views, in the order of ``layout.bufs``
    have: Assembly = field(default_factory=Assembly)  # chunk indices written
    ref: object = None  # the shared-memory segment the buffers are in (``shm``), if any
    first: float | None = None  # when its first chunk came (a trace's)

    @property
    def complete(self) -> bool:
        return len(self.have) == self.layout.n


def _is_feed(t) -> bool:
    return isinstance(t, list) and len(t) == 2 and all(isinstance(s, str) for s in t)


class Bulk:
    """One node's chunks in flight: those it sends (a leaf) and those it
    assembles and passes on (a host relay)."""

    def __init__(
        self,
        codec: P.Codec,
        clock: Callable[[], float],
        stall: float,
        chunk: int = 0,
        threshold: int = THRESHOLD,
        fanout: int = 0,
        shape: str = "auto",
    ):
        self.codec, self.clock, self.stall = codec, clock, stall
        # where a host relay assembles: sizes -> (segment, views) in shared memory, or None
        self.reserve: Callable[[tuple], tuple | None] = lambda sizes: None
        self.discard: Callable[[object], None] = lambda ref: None  # a segment no request took
        self.chunk, self.threshold, self.fanout = chunk, threshold, fanout  # 0: chosen per request
        self.shape = shape  # "auto": chosen per request
        self.gauge = Gauge()  # the link, as this node's pushes timed it
        self.outgoing: dict[str, Outgoing] = {}  # request key -> its chunks
        self.incoming: dict[str, Incoming] = {}  # bulk id -> its assembly
        self.early: dict[str, list] = {}  # bulk id -> chunks come before their envelope
        self.early_since: dict[str, float] = {}
        self.early_bytes = 0
        self.sent = self.received = self.forwarded = self.duplicates = 0  # chunks, for stats
        self.last: dict | None = None  # the last request's plan: fanout, hosts in order, chunks

    # ------------------------------------------------------------- the leaf
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
        out_id = f"{boot[:12]}.{p.key}"
        messages = []
        for j in range(layout.n):
            k, offset, size = layout.locate(j)
            data = memoryview(p.inner[5 + bufs[k][0]]).cast("B")[offset : offset + size]
            messages.append(self.codec.pack(CHUNK_MSG, dict(id=out_id, i=j, d=digest(data)), [data]))
        order = [h for h, _ in hosts]
        two = plan.shape == TWO_TREES
        trees = [binary(order), binary(order[::-1])] if two else [heap(order, plan.fanout)]
        out = Outgoing(out_id, layout, plan, trees, messages, dict(hosts), self.clock())
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
        """The leaf's own sends: each tree's chunks to the hosts it feeds there."""
        return [s for t, tree in enumerate(out.trees) for s in self.sends_for(out, tree[None], t)]

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
        for inc in self.incoming.values():
            if inc.key == key:
                inc.key = None  # its chunks still go on to the hosts it feeds

    # ------------------------------------------------------- a host relay
    def expect(self, p, content, n_buffers: int) -> tuple[Incoming, list[Send]]:
        """``p`` came with a chunk layout: assemble it (chunks come on the bulk socket)."""
        if not isinstance(content, dict) or not isinstance(content.get("id"), str):
            raise P.ProtocolError("bulk content without an id")
        layout = Layout.from_content(content, n_buffers)
        trees = [content.get("to") or []] + ([content["odd"]] if "odd" in content else [])
        if not all(isinstance(to, list) and all(_is_feed(t) for t in to) for to in trees):
            raise P.ProtocolError("bulk content with a bad list of hosts to feed")
        if content["id"] in self.incoming:
            raise P.ProtocolError(f"bulk id {content['id']!r} in use")
        inc = self.incoming[content["id"]] = Incoming(
            content["id"], layout, [[tuple(t) for t in to] for to in trees], p.key, self.clock()
        )
        made = self.reserve(layout.bufs)  # written in place: the engines of this host map it
        if made is not None:
            inc.ref, views = made
            inc.buffers = [v.cast("B") for v in views]
        else:
            inc.buffers = [memoryview(bytearray(n)) for _, n in layout.bufs]
        sends = []
        self.early_since.pop(inc.id, None)
        for frames in self.early.pop(inc.id, []):
            self.early_bytes -= P.nbytes(frames[-1])
            sends += self._take(inc, frames)
        return inc, sends

    def on_chunk(self, frames) -> tuple[list[Send], Incoming | None]:
        """A chunk from the host (or leaf) that feeds this one: checked, passed
        on, kept; the assembly if it is now complete."""
        _, body = P.split_idents(frames)
        content = checked(self.codec, body, CHUNK_MSG, "chunk")["content"]
        if not isinstance(content.get("id"), str) or type(content.get("i")) is not int:
            raise P.ProtocolError("a chunk without its request's id and its index")
        inc = self.incoming.get(content["id"])
        if inc is None:  # its envelope is still on its way (another link)
            self.early.setdefault(content["id"], []).append(body)
            self.early_since.setdefault(content["id"], self.clock())
            self.early_bytes += P.nbytes(body[5])
            self._trim_early()
            return [], None
        sends = self._take(inc, body, j=content["i"])
        if inc.complete and inc.key is None and inc.buffers:  # its request was done here already
            self.finished(inc, adopted=False)
        return sends, inc if inc.complete and inc.key is not None else None

    def _take(self, inc: Incoming, body, j: int | None = None) -> list[Send]:
        if j is None:
            j = self.codec.content(dict(content=body[4]))["i"]
        if not 0 <= j < inc.layout.n:
            raise P.ProtocolError(f"chunk {j} of {inc.id}, which has {inc.layout.n}")
        k, offset, size = inc.layout.locate(j)
        if P.nbytes(body[5]) != size:
            raise P.ProtocolError(f"chunk {j} of {inc.id} has {P.nbytes(body[5])} bytes, not {size}")
        if not inc.have.put(j, inc.buffers[k], offset, body[5]):
            self.duplicates += 1
            return []
        inc.last = self.clock()
        inc.first = inc.last if inc.first is None else inc.first
        self.received += 1
        to = inc.to[j % len(inc.to)]
        self.forwarded += len(to)
        return [to_host(url, [P._DELIM, *body], host_ident(label)) for label, url in to]

    def finished(self, inc: Incoming, adopted: bool):
        """The request has its buffers (``adopted``: and its segment, if any):
        keep the id (late duplicates), not the bytes."""
        if inc.ref is not None and not adopted:
            self.discard(inc.ref)
        inc.key, inc.buffers, inc.ref = None, [], None

    def stalled(self, now: float) -> list[Incoming]:
        """Assemblies with no chunk for ``stall`` seconds, forgotten here."""
        gone = [inc for inc in self.incoming.values() if not inc.complete and now - inc.last > self.stall]
        for inc in gone:
            del self.incoming[inc.id]
            if inc.ref is not None:
                self.discard(inc.ref)
        for inc in [i for i in self.incoming.values() if i.complete and now - i.last > self.stall]:
            del self.incoming[inc.id]  # complete and quiet: no duplicate can still come
            if inc.ref is not None:
                self.discard(inc.ref)
        for bulk_id in [b for b, t in self.early_since.items() if now - t > self.stall]:
            self._forget_early(bulk_id)  # no envelope came: the request was not for this host
        return gone

    def next_deadline(self) -> float | None:
        if not self.incoming and not self.early_since:  # (asked every loop turn: most turns move no chunk)
            return None
        times = [inc.last for inc in self.incoming.values()] + list(self.early_since.values())
        return min(times) + self.stall if times else None

    def _trim_early(self):
        while self.early_bytes > EARLY_LIMIT and self.early:
            bulk_id = next(iter(self.early))
            log.warning(
                "dropped %d early chunks of %s: more than %d bytes wait for envelopes",
                len(self.early[bulk_id]),
                bulk_id,
                EARLY_LIMIT,
            )
            self._forget_early(bulk_id)

    def _forget_early(self, bulk_id: str):
        self.early_bytes -= sum(P.nbytes(b[5]) for b in self.early.pop(bulk_id, []))
        self.early_since.pop(bulk_id, None)

    def stats(self) -> dict:
        stats = dict(
            bulk_sent=self.sent,
            bulk_received=self.received,
            bulk_forwarded=self.forwarded,
            bulk_duplicates=self.duplicates,
            bulk_chunk=self.chunk,
        )
        if self.last is not None:
            stats["bulk_last"] = self.last
        return stats
