"""A host relay's side of a push (``push``): each chunk checked (its
signature, its type, its bytes' digest), passed on to the hosts this one
feeds in the chunk's tree as soon as it is checked (cut-through), and
written in place; the request goes to the engines once every chunk is here
(``Incoming``). A chunk that comes twice (after healing) is dropped; chunks
that come before their envelope wait for it (bounded: ``EARLY_LIMIT``); a push
whose chunks stop coming for ``stall`` seconds is forgotten, and its engines
fail (``ChunksIn``). Sans I/O."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from ...wire import protocol as P
from ...wire.topology import host_ident
from ..events import Send
from .chunks import Assembly, checked, to_host
from .push import CHUNK_MSG, Layout

log = logging.getLogger(__name__)

EARLY_LIMIT = 256 << 20  # bytes of chunks held for envelopes not yet here


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


class PushIn:
    """A host relay's pushes in flight: each assembly, written in place
    (``reserve``: in the segment its engines map), its chunks passed on as
    they come; chunks come before their envelope held a while."""

    def __init__(
        self,
        codec: P.Codec,
        clock: Callable[[], float],
        stall: float,
        reserve: Callable[[tuple], tuple | None] = lambda sizes: None,
        discard: Callable[[object], None] = lambda ref: None,
    ):
        self.codec, self.clock, self.stall = codec, clock, stall
        # where to assemble: sizes -> (segment, views) in shared memory, or None; a segment no request took
        self.reserve, self.discard = reserve, discard
        self.incoming: dict[str, Incoming] = {}  # bulk id -> its assembly
        self.early: dict[str, list] = {}  # bulk id -> chunks come before their envelope
        self.early_since: dict[str, float] = {}
        self.early_bytes = 0
        self.received = self.forwarded = self.duplicates = 0  # chunks, for stats

    def release(self, p):
        """``p`` is done here: its chunks still go on to the hosts this one feeds."""
        for inc in self.incoming.values():
            if inc.key == p.key:
                inc.key = None

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
        gone = [inc for inc in self.incoming.values() if not inc.complete and now - inc.last >= self.stall]
        for inc in gone:
            del self.incoming[inc.id]
            if inc.ref is not None:
                self.discard(inc.ref)
        for inc in [i for i in self.incoming.values() if i.complete and now - i.last >= self.stall]:
            del self.incoming[inc.id]  # complete and quiet: no duplicate can still come
            if inc.ref is not None:
                self.discard(inc.ref)
        for bulk_id in [b for b, t in self.early_since.items() if now - t >= self.stall]:
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
        return dict(bulk_received=self.received, bulk_forwarded=self.forwarded, bulk_duplicates=self.duplicates)
