"""Big reduce values across hosts: a pipelined chain of host relays.

A leaf that sends a reduce to two or more host relays chains them, ordered by
the first engine id each serves: the last host (the tail) sends its host's
combined value in chunks to the one before it, which combines each chunk with
its own and sends it on, and so on; the first host (the head) sends the
chain's value to the leaf. Each link carries the value once, chunk after
chunk, so a reduce over hosts costs about one value's time on one link, where
every host sending its whole value to the leaf cost one per host on the
leaf's link. The values combine in a fixed order: the first host's, then
the second's, ... (``v1 + (v2 + (... + vk))``).

A link (``ChainLink``: one request's part, at one host) is fed by up to two hosts,
each in its slot: a chain's by one, two trees' by two (``uplinks`` plans the
way and cuts a host's value into its parts). It combines each chunk of this
host's own value with what each feeder sent, in slot order. A link with a
``window`` sends a chunk only below the credit the host it feeds grants
(``ipb_rcredit``: ``{key, upto}``), and grants its own feeders that many
chunks beyond what it sent on: so two feeders share a link in step, and a
host holds at most a window of each feeder's chunks.

Only big values take the chain (``threshold``, the data plane's): a host
whose own value is small sends it in its bundle, as before, and passes on
what comes to it. The bundles (engine ids, errors, failures) still go from
every host to the leaf directly; a chained bundle says its value is in the
chain. A chain message is signed, and its content carries the SHA-256 of its
bytes: ``{key, s: slot, i, n, v: value header}``; ``n = 0``: no value (``error``: the
values did not combine). The leaf fails the chained engines by name when a
host of the chain is lost, or when the chain stalls.

A host's own value may come in stripes (``own_begin``, ``own_ready``: its
engines combine it stripe by stripe, ``hostfold``): each chunk goes on as soon as
its bytes are final, so the chain does not wait for the whole host's value.
A host that cannot finish its value once part of it went on ends the chain
with an error (``abort``): no host can take back what it sent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from ...wire import protocol as P
from ...wire import reduction as R
from ...wire.topology import HOST_PREFIX
from ..events import UP, Send
from .chunks import Assembly, checked, count, digest, piece, size, to_host
from .ends import Ended
from .plans import MAX_FEEDS

log = logging.getLogger(__name__)

RCHUNK = "ipb_rchunk"
MARK = b'"' + RCHUNK.encode() + b'"'  # in a chain message's header frame
RCREDIT = "ipb_rcredit"  # a host to its feeders: send chunks below ``upto`` (``window``)
CREDIT_MARK = b'"' + RCREDIT.encode() + b'"'
MAX_VALUE = 1 << 40  # a chain value said to be bigger is refused (no buffer of that size is made)


def _header(value_header: dict | None) -> tuple | None:
    """What must match for two values to combine: dtype, shape, scalar."""
    if value_header is None:
        return None
    return (value_header.get("dtype"), tuple(value_header.get("shape") or ()), bool(value_header.get("scalar")))


@dataclass
class ChainLink:
    """One request's place in a chain, at a host relay."""

    key: str  # the request's key (the leaf's, shared by its hosts)
    op: str
    to: str | None  # the bulk socket of the host before this one; None: the leaf
    feeds: int  # how many hosts send to this one (a chain: 1 or 0; a tree: 0 to 2)
    slot: int = 0  # this host's place among the hosts that feed the one it sends to
    own: tuple | None = None  # (value header, bytes) of this host's own big value
    own_done: bool = False
    upto: int = 0  # bytes of ``own`` that are final (it may come in stripes)
    next_own: int = 0  # the next chunk of ``own`` alone to send (nothing comes from after this host)
    used: bool = False  # a chunk with this host's own bytes went on
    heads: dict = field(default_factory=dict)  # feeding slot -> its value's first content (n, v or error)
    chunks: dict = field(default_factory=dict)  # incoming chunk index -> {slot: bytes}, not yet sent on
    sent: set = field(default_factory=set)
    done: bool = False
    sink: Callable | None = None  # where the head's chunks go instead of the leaf (``ring``)
    window: int = 0  # > 0: chunks go to ``to`` only below the credit it grants, and this host
    # grants its feeders (``feeders``: their bulk sockets, by slot) that many beyond what it sent on
    feeders: list = field(default_factory=list)
    credit: int = 0
    granted: int = 0


def covered(ranges, start: int) -> int:
    """How far from ``start`` the byte ranges ``(lo, hi)`` cover without a gap."""
    upto = start
    for lo, hi in sorted(ranges):
        if lo <= upto < hi:
            upto = hi
    return upto


def within(ranges, lo: int, hi: int) -> list[tuple[int, int]]:
    """The parts of byte ranges ``(a, b)`` inside ``[lo, hi)``, from ``lo``."""
    return [(max(a, lo) - lo, min(b, hi) - lo) for a, b in ranges if a < hi and b > lo]


class Chains:
    """A host relay's chain links in flight (pure: chain messages in, sends out)."""

    def __init__(self, codec: P.Codec, stall: float, chunk: int):
        self.codec, self.stall, self.chunk = codec, stall, chunk  # stall: how long the leaf waits (``reduce_chains``)
        self.links: dict[str, ChainLink] = {}
        self.open: set[str] = set()  # at a leaf: requests whose chain's outcome is not known yet
        self.aborted = Ended()  # keys of links this host ended early: later chunks are dropped
        self.sent = self.received = 0  # chunks, for stats
        self.shape: str | None = None  # at a leaf: the last reduce's way between hosts, for stats

    def join(self, key: str, op: str, content, sink: Callable | None = None) -> None:
        """A reduce request came with its place in a chain (``sink``: at the
        head, ``sink(content, chunk)`` takes each chunk instead of the leaf)."""
        if not isinstance(content, dict):
            raise P.ProtocolError("chain content is not a dict")
        to, feeds, slot = content.get("to"), content.get("feeds"), content.get("slot", 0)
        if not (to is None or isinstance(to, str)) or type(feeds) is not int or not 0 <= feeds <= MAX_FEEDS:
            raise P.ProtocolError("bad chain content")
        if type(slot) is not int or not 0 <= slot < MAX_FEEDS:
            raise P.ProtocolError(f"bad chain slot {slot!r}")
        window, feeders = content.get("window", 0), content.get("feeders", [])
        if type(window) is not int or window < 0 or not isinstance(feeders, list):
            raise P.ProtocolError("bad chain window")
        if window and (len(feeders) != feeds or not all(isinstance(f, str) for f in feeders)):
            raise P.ProtocolError("a chain window without its feeders")
        if key in self.links:
            raise P.ProtocolError(f"chain for {key!r} already here")
        self.links[key] = ChainLink(key, op, to, feeds, slot, sink=sink, window=window, feeders=feeders, credit=window)

    def own_value(self, key: str, header: dict | None, data) -> list[Send]:
        """This host's engines are all in: its own big value (or None: it has none)."""
        link = self.links.get(key)
        if link is None:
            return []
        if link.own is not None and not link.own_done and (header is not None or link.used):  # in stripes
            if header is None:
                return self.abort(key, "this host's value did not come whole")
            link.own_done, link.upto = True, memoryview(link.own[1]).nbytes
            return self._advance(link)
        link.own, link.own_done = (header, data) if header is not None else None, True
        link.upto = memoryview(data).nbytes if header is not None else 0
        return self._advance(link)

    def own_begin(self, key: str, header: dict, data) -> bool:
        """This host's own value will be final in ``data`` stripe by stripe
        (``own_ready``): False if ``key`` has no link here."""
        link = self.links.get(key)
        if link is None or link.used or link.own_done:
            return False
        link.own, link.upto = (header, data), 0
        return True

    def own_ready(self, key: str, ranges) -> list[Send]:
        """These byte ranges ``(lo, hi)`` of this host's own value are final
        (the chain sends what is final from its start)."""
        link = self.links.get(key)
        if link is None or link.own is None or link.own_done:
            return []
        link.upto = covered(ranges, 0)
        return self._advance(link)

    def consumed(self, key: str) -> bool:
        """Whether part of this host's own value for ``key`` went on already."""
        link = self.links.get(key)
        return link is not None and link.used

    def abort(self, key: str, why: str) -> list[Send]:
        """End ``key``'s chain here with ``why``: the hosts before this one,
        and the leaf, learn that the value is lost."""
        link = self.links.get(key)
        if link is None:
            return []
        self.aborted.add(key)
        return self._finish(link, self._message(link, dict(n=0, error=why)))

    def on_message(self, msg: dict, data) -> list[Send]:
        """A chain message from a host that feeds this one."""
        content = msg["content"]
        link = self.links.get(content.get("key"))
        if link is None and content.get("key") in self.aborted:
            return []  # this host ended that chain: what still comes goes no further
        if link is None or not link.feeds or link.done:
            raise P.ProtocolError(f"chain message for {content.get('key')!r}, not expected here")
        slot = content.get("s", 0)
        if type(slot) is not int or not 0 <= slot < link.feeds:
            raise P.ProtocolError(f"chain message from slot {slot!r} of {link.feeds}")
        self.received += 1
        head = link.heads.get(slot)
        if head is None or content.get("error"):  # (the hosts before that one lost the value: so did the chain)
            link.heads[slot] = head = content
        elif (content.get("n"), content.get("v")) != (head.get("n"), head.get("v")):
            raise P.ProtocolError("chain chunks that disagree on the value")
        i = content.get("i")
        if head.get("n") and not head.get("error"):
            got = link.chunks.setdefault(i, {})
            if slot in got or i in link.sent:
                raise P.ProtocolError(f"chain chunk {i} came twice")
            got[slot] = data
        return self._advance(link)

    def _incoming(self, link: ChainLink) -> tuple[dict | None, list[int]]:
        """What comes from the feeding hosts, once each has said: the value's
        first content (``n = 0``: none; or an error), and the slots with a value."""
        errors = [h for _, h in sorted(link.heads.items()) if h.get("error")]
        if errors:
            return errors[0], []
        if len(link.heads) < link.feeds:
            return None, []
        valued = [s for s, h in sorted(link.heads.items()) if h.get("n")]
        if not valued:
            return dict(n=0), []
        first = link.heads[valued[0]]
        for s in valued[1:]:
            other = link.heads[s]
            if (other.get("n"), _header(other.get("v")), other["v"].get("nbytes")) != (
                first["n"],
                _header(first["v"]),
                first["v"].get("nbytes"),
            ):
                why = f"hosts gave values that do not combine: {_header(first['v'])} and {_header(other['v'])}"
                return dict(n=0, error=why), []
        return first, valued

    def _advance(self, link: ChainLink) -> list[Send]:
        incoming, valued = self._incoming(link)
        if incoming is not None and incoming.get("error"):
            return self._finish(link, self._message(link, dict(n=0, error=incoming["error"])))
        if incoming is None or (link.own is None and not link.own_done):
            return []  # not every feeding host said yet, or whether this host adds a value is not known yet
        if not incoming.get("n"):  # nothing from before this host: its own value, or none
            if link.own is None:
                return self._finish(link, self._message(link, dict(n=0)))
            return self._own_chunks(link)
        if incoming["v"]["chunk"] != self.chunk:
            why = "hosts of the chain use different chunk sizes"
            return self._finish(link, self._message(link, dict(n=0, error=why)))
        if link.own is not None and (
            _header(link.own[0]) != _header(incoming.get("v"))
            or memoryview(link.own[1]).nbytes != incoming["v"].get("nbytes")
        ):
            why = f"hosts gave values that do not combine: {_header(link.own[0])} and {_header(incoming.get('v'))}"
            return self._finish(link, self._message(link, dict(n=0, error=why)))
        sends = []
        for i in sorted(link.chunks):
            if (link.own is not None and not self._final(link, i)) or not self._may_send(link, i):
                break  # (its bytes are final in order, and credit comes in order: no later chunk may go)
            if not all(s in link.chunks[i] for s in valued):
                continue
            came = link.chunks.pop(i)
            try:
                chunk = self._combined(link, i, incoming["v"]["dtype"], [came[s] for s in valued])
            except ValueError as e:
                return sends + self._finish(link, self._message(link, dict(n=0, error=f"chain: {e}")))
            sends += self._message(link, dict(i=i, n=incoming["n"], v=incoming["v"]), chunk)
            link.sent.add(i)
        sends += self._grant(link)
        if len(link.sent) == incoming["n"]:
            link.done = True
            del self.links[link.key]
        return sends

    @staticmethod
    def _may_send(link: ChainLink, i: int) -> bool:
        """Chunk ``i`` may go: no window, or the host it goes to granted it."""
        return not link.window or link.to is None or i < link.credit

    def _grant(self, link: ChainLink) -> list[Send]:
        """Credit to the feeders, every half window sent on: so two feeders
        share this host's link in step, and none floods its queue ahead of
        the chunks it waits for."""
        if not link.window or not link.feeders or len(link.sent) < link.granted + max(1, link.window // 2):
            return []
        link.granted = len(link.sent)
        frames = self.codec.pack(RCREDIT, dict(key=link.key, upto=link.granted + link.window), [])
        return [to_host(url, frames) for url in link.feeders]

    def on_credit(self, msg: dict) -> list[Send]:
        """The host this one feeds grants chunks below ``upto``."""
        content = msg["content"]
        link, upto = self.links.get(content.get("key")), content.get("upto")
        if type(upto) is not int:
            raise P.ProtocolError(f"bad chain credit {upto!r}")
        if link is None or not link.window:
            return []  # (a link done, or ended: credit comes after its last chunk went)
        link.credit = max(link.credit, upto)
        return self._advance(link)

    def _combined(self, link: ChainLink, i: int, dtype: str, came: list):
        """Chunk ``i`` of this host's own value (if any), then what came from
        each feeding host in slot order: the chain's fixed order."""
        out = None
        if link.own is not None:
            out = piece(memoryview(link.own[1]).cast("B"), i, self.chunk)
            link.used = True
        for chunk in came:
            out = chunk if out is None else R.combine_bytes(link.op, dtype, out, chunk)
        return out

    def _final(self, link: ChainLink, i: int) -> bool:
        """Chunk ``i`` of this host's own value is final."""
        return link.own_done or min((i + 1) * self.chunk, memoryview(link.own[1]).nbytes) <= link.upto

    def _own_chunks(self, link: ChainLink) -> list[Send]:
        """This host's own value alone, chunk after chunk as each is final."""
        header, data = link.own
        view = memoryview(data).cast("B")
        n = max(1, count(view.nbytes, self.chunk))
        header = dict(header, nbytes=view.nbytes, chunk=self.chunk)
        sends = []
        while link.next_own < n and self._final(link, link.next_own) and self._may_send(link, link.next_own):
            i = link.next_own
            sends += self._message(link, dict(i=i, n=n, v=header), piece(view, i, self.chunk))
            link.next_own, link.used = i + 1, True
        if link.next_own == n:
            return self._finish(link, sends)
        return sends

    def _message(self, link: ChainLink, content: dict, data=b"") -> list[Send]:
        content = dict(content, key=link.key, s=link.slot, d=digest(data))
        if link.to is None and link.sink is not None:
            return link.sink(content, data)
        frames = self.codec.pack(RCHUNK, content, [data])
        self.sent += 1
        if link.to is None:
            return [Send(UP, frames)]
        return [to_host(link.to, frames)]  # (frames start with DELIM)

    def _finish(self, link: ChainLink, sends: list[Send]) -> list[Send]:
        link.done = True
        self.links.pop(link.key, None)
        return sends

    def end(self, keys) -> list[Send]:
        """The leaf gave up on these chains (a host of theirs was lost, or
        they stalled): their links go, and what still comes for them is
        dropped quietly. A host keeps a link for as long as its leaf waits
        (its engines, or the hosts after it, may compute for hours)."""
        for key in keys:
            if self.links.pop(key, None) is not None:
                self.aborted.add(key)
        return []  # (nothing to send: the leaf told every host)


def check(codec: P.Codec, body) -> tuple[dict, object]:
    """A chain message's parsed message and its bytes (signature and digest checked)."""
    msg = checked(codec, body, RCHUNK, "chain message")
    content = msg["content"]
    n = content.get("n")
    if not isinstance(content.get("key"), str) or type(n) is not int or n < 0:
        raise P.ProtocolError("bad chain message")
    if n:
        v, i = content.get("v"), content.get("i")
        if not (isinstance(v, dict) and all(type(v.get(k)) is int and v[k] > 0 for k in ("nbytes", "chunk"))):
            raise P.ProtocolError("a chain chunk without its value's size")
        if v["nbytes"] > MAX_VALUE or n != count(v["nbytes"], v["chunk"]):
            raise P.ProtocolError(f"a chain value of {v['nbytes']} bytes in {n} chunks")
        if type(i) is not int or not 0 <= i < n:
            raise P.ProtocolError(f"chain chunk {i!r} of {n}")
        if P.nbytes(body[5]) != size(i, v["nbytes"], v["chunk"]):
            raise P.ProtocolError(f"chain chunk {i} has {P.nbytes(body[5])} bytes")
    return msg, body[5]


def check_credit(codec: P.Codec, body) -> dict:
    """A chain credit's parsed message (signature checked)."""
    msg = codec.unpack(body)
    if msg["header"].get("msg_type") != RCREDIT or not isinstance(msg["content"], dict):
        raise P.ProtocolError("not a chain credit")
    return msg


# --------------------------------------------------------------- at the leaf
@dataclass
class Chain:
    """At the leaf: a reduce's way of hosts (a chain, or two trees:
    ``uplinks``), and the value its heads send, part by part."""

    hosts: list[bytes]  # every host of the way, in order
    heads: list[bytes]  # the host that sends each part here
    key: float  # where the value combines in the leaf's fixed order
    last: float
    parts: dict = field(default_factory=dict)  # part -> (n, v) of its chunks; n = 0: none
    header: dict | None = None
    buffer: bytearray | None = None
    have: Assembly = field(default_factory=Assembly)  # (part, chunk) written
    stashed: list = field(default_factory=list)  # chained hosts' eids, until the value is in
    outcome: str | None = None  # "value", "none", "failed"
    why: str = ""

    @property
    def label(self) -> str:
        return ", ".join(h[len(HOST_PREFIX) :].decode(errors="replace") for h in self.hosts)


def take(chain: Chain, part: int, msg: dict, data) -> bool:
    """A message of ``part`` from its head, at the leaf: True once the
    outcome is known (the value assembled, none, or an error)."""
    content = msg["content"]
    if content.get("error"):
        chain.outcome, chain.why = "failed", str(content["error"])
        return True
    n, v = content["n"], content.get("v")
    if part in chain.parts and chain.parts[part] != (n, v):
        raise P.ProtocolError("chain chunks that disagree on the value")
    if n:
        at, whole = v.get("at", 0), v.get("whole", v["nbytes"])  # (n, v checked: ``check``)
        if not (type(at) is int and type(whole) is int and 0 <= at and at + v["nbytes"] <= whole <= MAX_VALUE):
            raise P.ProtocolError(f"a chain part of {v['nbytes']} bytes at {at!r} of {whole!r}")
        if chain.buffer is None:
            chain.header, chain.buffer = v, bytearray(whole)
        elif _header(v) != _header(chain.header) or whole != len(chain.buffer):
            raise P.ProtocolError("chain parts that disagree on the value")
        if not chain.have.put((part, content["i"]), chain.buffer, at + content["i"] * v["chunk"], data):
            return False  # (it came twice: the outcome is as it was)
    chain.parts[part] = (n, v)
    if len(chain.parts) < len(chain.heads) or len(chain.have) < sum(n for n, _ in chain.parts.values()):
        return False
    spans = sorted((v.get("at", 0), v.get("at", 0) + v["nbytes"]) for n, v in chain.parts.values() if n)
    if not spans:
        chain.outcome = "none"
    elif covered(spans, 0) != len(chain.buffer) or sum(hi - lo for lo, hi in spans) != len(chain.buffer):
        chain.outcome, chain.why = "failed", f"the parts brought bytes {spans} of {len(chain.buffer)}"
    else:
        chain.outcome = "value"
    return True
