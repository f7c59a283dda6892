"""An allreduce's big values among hosts: a ring of host relays (sans I/O).

For an allreduce whose targets are all on two or more host relays of one
leaf, the leaf puts those hosts in a ring (``plans.ring``: by first engine id), and
each host's combined value is cut into P parts on chunk boundaries (``cuts``).

- Reduce-scatter: part k goes round as a reduce chain (``upchain``: a link per
  part, keyed ``key#k``) that starts at host k + 1 and ends at host k, each
  host putting its own bytes of the part first: ``v_k + (v_k-1 + (... +
  v_k+1))``, indices mod P. The order is fixed by the ring, so a float sum is
  the same on every run.
- Allgather: host k writes each final chunk of part k over its own bytes and
  sends it to the next host, which writes it over its own and passes the same
  signed frames on, until the host before k has it. A final chunk comes to a
  host only after that host's own bytes of it went on, so each host's value
  becomes the result in place: in the segment its engines then map.

Both phases run at once, chunk by chunk: each link carries 2 (P - 1)/P of the
value, where a reduce then a push carry it twice through the root's host. A
host's bundle goes to the leaf once the whole value is here (``settled``),
standing for it as a ``RingValue``; the root then has each host's engines bind
it (``bind``). A host that takes no part (no value, a small one, an error)
sends its bundle as usual, and the leaf ends the ring at the other hosts
(``end``), as it does when a host of the ring is lost. Nothing here times out
while the ring runs: hosts wait as long as the leaf does. A value no bind
came for is let go after ``stall`` seconds (``expired``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from ...wire import protocol as P
from ..events import Send
from .chains import Chains, within
from .chunks import Assembly, checked, count, cuts, size, to_host
from .ends import Ended

log = logging.getLogger(__name__)

RGATHER = "ipb_rgather"
MARK = b'"' + RGATHER.encode() + b'"'  # in a ring chunk's header frame


def takes_part(nbytes: int, chunk: int, n: int) -> bool:
    """Whether a value of ``nbytes`` goes round a ring of ``n`` hosts: each part at least one chunk."""
    return nbytes >= n * chunk


@dataclass
class Ring:
    """One allreduce's ring, at one host relay."""

    key: str  # the request's key (the leaf's, shared by its hosts)
    msg_id: str
    urls: list[str]  # the hosts' bulk sockets, in ring order
    at: int  # this host's place
    own: tuple | None = None  # (value header, writable bytes): this host's value, the result in the end
    cuts: list[int] = field(default_factory=list)
    have: Assembly = field(default_factory=Assembly)  # (part, chunk) final here
    total: int = 0  # chunks in all
    outcome: str | None = None  # "value" or "failed"
    why: str = ""
    waiting: object = None  # this host's request, whose bundle goes once the outcome is known
    ref: object = None  # the segment the value lives in (its name stays for the engines to map)
    since: float = 0.0  # when the value was whole here

    @property
    def n(self) -> int:
        return len(self.urls)

    def part(self, k: int) -> str:
        return f"{self.key}#{k}"

    def send(self, frames) -> Send:
        return to_host(self.urls[(self.at + 1) % self.n], frames)


class Rings:
    """A host relay's rings: chunks and the leaf's word in, sends out."""

    def __init__(self, codec: P.Codec, chains: Chains, threshold, clock: Callable[[], float], stall: float, drop=None):
        self.codec, self.chains, self.clock, self.stall = codec, chains, clock, stall
        self.threshold = threshold or 0  # a smaller value does not go round (the data plane's threshold)
        self.drop = drop or (lambda ref: None)  # a segment's name goes (``Sharing.drop_value``)
        self.rings: dict[str, Ring] = {}  # by key, while the value comes together here
        self.results: dict[str, Ring] = {}  # by key: whole values, until the root's bind takes them
        self.settled: list[Ring] = []  # outcomes just known: their bundles go (the node drains it)
        self.ended = Ended()  # rings ended here, and why: what still comes for them is dropped
        self.gathered = self.forwarded = 0  # final chunks written here, and passed on

    @property
    def chunk(self) -> int:
        return self.chains.chunk

    def join(self, key: str, msg_id: str, op: str, content) -> None:
        """An allreduce request came with its place in a ring."""
        urls, at = (content.get("urls"), content.get("at")) if isinstance(content, dict) else (None, None)
        if not (isinstance(urls, list) and len(urls) >= 2 and all(isinstance(u, str) for u in urls)):
            raise P.ProtocolError("bad ring content")
        if type(at) is not int or not 0 <= at < len(urls) or key in self.rings:
            raise P.ProtocolError(f"bad place {at!r} in the ring of {key!r}")
        ring = self.rings[key] = Ring(key, msg_id, urls, at)
        for k in range(ring.n):  # this host sends every part to the next, but its own (the head's)
            head = k == at
            to = dict(to=None if head else urls[(at + 1) % ring.n], feeds=int(k != (at - 1) % ring.n))
            self.chains.join(ring.part(k), op, to, sink=partial(self._final_chunk, ring, k) if head else None)

    # ------------------------------------------------ this host's own value
    def has(self, key: str) -> bool:
        return key in self.rings

    def own_begin(self, key: str, header: dict, data) -> bool:
        """This host's value will be final in ``data`` stripe by stripe
        (``own_ready``): False if it does not go round (too small, read-only)."""
        ring = self.rings.get(key)
        if ring is None or ring.own is not None or not self._fits(ring, data):
            return False
        self._own(ring, header, data)
        return all(self.chains.own_begin(ring.part(k), header, view) for k, view in self._parts(ring))

    def order(self, key: str) -> list[tuple[int, int]]:
        """This host's parts in the order the ring needs its bytes: first the
        part it starts (k = at - 1), then each part as it comes round (at - 2,
        at - 3, ...), its own part last."""
        ring = self.rings[key]
        parts = [((ring.at - 1 - s) % ring.n) for s in range(ring.n)]
        return [(ring.cuts[k], ring.cuts[k + 1]) for k in parts]

    def own_ready(self, key: str, ranges) -> list[Send]:
        """These byte ranges ``(lo, hi)`` of this host's value are final."""
        ring = self.rings.get(key)
        if ring is None or ring.own is None:
            return []
        sends = []
        for k in range(ring.n):
            sends += self.chains.own_ready(ring.part(k), within(ranges, ring.cuts[k], ring.cuts[k + 1]))
        return sends

    def own_value(self, key: str, header: dict, data, ref=None, waiting=None) -> list[Send] | None:
        """This host's whole value (in ``data``, writable; ``ref``: its segment,
        which the ring now keeps; ``waiting``: the request whose bundle goes
        once the outcome is known): None if it does not go round."""
        ring = self.rings.get(key)
        if ring is None or not (ring.own is not None or self._fits(ring, data)):
            return None
        if ring.own is None:
            self._own(ring, header, data)
        ring.ref, ring.waiting = ref, waiting
        sends = []
        for k, view in self._parts(ring):
            sends += self.chains.own_value(ring.part(k), header, view)
        return sends + self._check(ring)

    def consumed(self, key: str) -> bool:
        """Whether part of this host's value went on already."""
        ring = self.rings.get(key)
        return ring is not None and any(self.chains.consumed(ring.part(k)) for k in range(ring.n))

    def abort(self, key: str, why: str) -> list[Send]:
        """This host cannot finish its value: its ring ends here (its bundle
        says why, and the leaf ends the ring at the other hosts)."""
        ring = self.rings.get(key)
        return self._fail(ring, why) if ring is not None else []

    def takes(self, key: str, nbytes: int) -> bool:
        """Whether a value of ``nbytes`` goes round ``key``'s ring (over the
        data plane's threshold, and a chunk or more for each host)."""
        ring = self.rings.get(key)
        return ring is not None and nbytes >= self.threshold and takes_part(nbytes, self.chunk, ring.n)

    def _fits(self, ring: Ring, data) -> bool:
        view = memoryview(data)
        return self.takes(ring.key, view.nbytes) and not view.readonly and view.contiguous

    def _own(self, ring: Ring, header: dict, data) -> None:
        view = memoryview(data).cast("B")
        ring.own, ring.cuts = (header, view), cuts(view.nbytes, self.chunk, ring.n)
        ring.total = count(view.nbytes, self.chunk)

    @staticmethod
    def _parts(ring: Ring):
        view = ring.own[1]
        return [(k, view[ring.cuts[k] : ring.cuts[k + 1]]) for k in range(ring.n)]

    # ----------------------------------------------------- the final chunks
    def _final_chunk(self, ring: Ring, k: int, content: dict, data) -> list[Send]:
        """At the head of part ``k``: a final chunk (or why there is none)."""
        if content.get("error"):
            return self._fail(ring, str(content["error"]))
        if not content.get("n"):
            return self._fail(ring, f"part {k} came round without a value")
        i = content["i"]
        if not self._write(ring, k, i, data):
            return []  # (it came twice)
        gather = dict(key=ring.key, k=k, i=i, n=content["n"], d=content["d"])
        return [ring.send(self.codec.pack(RGATHER, gather, [data]))] + self._check(ring)

    def on_gather(self, msg: dict, data, body) -> list[Send]:
        """A final chunk from the host before this one: written here, and passed
        on (the same frames) unless the next host is the one it came from."""
        content = msg["content"]
        ring = self.rings.get(content.get("key"))
        if ring is None and content.get("key") in self.ended:
            return []  # (a ring ended here: what still comes is let be)
        if ring is None or ring.own is None:
            raise P.ProtocolError(f"ring chunk for {content.get('key')!r}, not expected here")
        k, i, n = content.get("k"), content.get("i"), content.get("n")
        if type(k) is not int or not 0 <= k < ring.n or k == ring.at:
            raise P.ProtocolError(f"ring chunk of part {k!r}")
        nbytes = ring.cuts[k + 1] - ring.cuts[k]
        if n != count(nbytes, self.chunk) or type(i) is not int or not 0 <= i < n:
            raise P.ProtocolError(f"ring chunk {i!r} of {n!r} in part {k}, not one this host waits for")
        if P.nbytes(data) != size(i, nbytes, self.chunk):
            raise P.ProtocolError(f"ring chunk {i} of part {k} has {P.nbytes(data)} bytes")
        if not self._write(ring, k, i, data):
            return []  # (it came twice: written and passed on once)
        sends = []
        if (ring.at + 1) % ring.n != k:
            sends.append(ring.send([P._DELIM] + list(body)))
            self.forwarded += 1
        return sends + self._check(ring)

    def _write(self, ring: Ring, k: int, i: int, data) -> bool:
        if not ring.have.put((k, i), ring.own[1], ring.cuts[k] + i * self.chunk, data):
            return False
        self.gathered += 1
        return True

    def _check(self, ring: Ring) -> list[Send]:
        if ring.outcome is None and ring.total and len(ring.have) == ring.total:
            ring.outcome, ring.since = "value", self.clock()
            del self.rings[ring.key]
            self.results[ring.key] = ring
            self.settled.append(ring)
        return []

    def _fail(self, ring: Ring, why: str) -> list[Send]:
        if ring.outcome is not None:
            return []
        ring.outcome, ring.why = "failed", why
        self.rings.pop(ring.key, None)
        self.chains.end([ring.part(k) for k in range(ring.n)])
        self._ended(ring)
        self.settled.append(ring)
        return []

    def _ended(self, ring: Ring) -> None:
        self.ended.add(ring.key, ring.why)
        if ring.ref is not None:
            self.drop(ring.ref)
            ring.ref = None

    # ------------------------------------------------- the leaf's word, the root's bind
    def end(self, keys, why: str) -> None:
        """The leaf ended these rings (a host of theirs took no part, or was
        lost): one under way fails with ``why``; a whole value here goes."""
        for key in keys:
            ring = self.rings.get(key)
            if ring is not None:
                self._fail(ring, why)
            elif key in self.results:
                self._ended(self.results.pop(key))

    def bind(self, msg_id: str) -> Ring | None:
        """The whole value of allreduce ``msg_id`` here, for its engines to bind
        (its segment is the bind request's now), or None."""
        key = next((k for k, r in self.results.items() if r.msg_id == msg_id), None)
        return self.results.pop(key) if key is not None else None

    def expired(self, now: float) -> list[str]:
        """Whole values no bind came for within ``stall`` seconds: let go."""
        gone = [k for k, r in self.results.items() if now - r.since > self.stall]
        for key in gone:
            self._ended(self.results.pop(key))
        return gone

    def next_deadline(self) -> float | None:
        since = min((r.since for r in self.results.values()), default=None)
        return None if since is None else since + self.stall

    def everything(self) -> list[str]:
        return list(self.rings) + list(self.results)


def check(codec: P.Codec, body) -> tuple[dict, object]:
    """A ring chunk's parsed message and its bytes (signature and digest checked)."""
    return checked(codec, body, RGATHER, "ring chunk"), body[5]
