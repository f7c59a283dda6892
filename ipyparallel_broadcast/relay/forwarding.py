"""Host relays that pass a call on to other host relays: a tree across hosts,
made per call, as Slurm forwards a message (``TreeWidth``).

A leaf keeps every host relay of its subtree as a child: it pings them, routes
their engines, plans big data's chunks and chains among them. But a call to
more than ``host_fanout`` of them is not sent to each. The leaf sends it to
``host_fanout`` *heads*; each head's request names the hosts it passes it on
to (``forward``), each with its own targets and the hosts below it, and so on
down (``plan``). A host relay that is passed a call sends its outcomes to the
host that passed it (``via``, on that host's chunk socket), which merges them
with its own, as a relay node merges its children's. So no process sends more
than ``host_fanout`` requests, or reads more than ``host_fanout`` bundles, per call.

Losses: the leaf still hears every host relay. One lost is failed where it is
owed: by the leaf if it was a head; else the leaf tells the host that passed it
the call (``P.LOST`` with ``host``), which fails what waits on it, and no
longer passes calls to it. A host lost takes the outcomes of the hosts below it
for the calls it was passing: they fail, named, and never hang.

Calls that keep the star: big data (its chunks and chains are planned per
host already), reductions, scatters, and stock clients' calls.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from ..wire import protocol as P
from ..wire.topology import HOST_PREFIX
from . import events as E
from .children import Children
from .context import NodeContext
from .dataplane.chunks import BULK
from .deadlines import Deadlines
from .events import DOWN, UP, Send
from .inflight import InFlight, Pending

FORWARD = "forward"  # request content: the hosts a head passes the call on to
VIA = "via"  # request content: [the passing host's label, its chunk socket]: outcomes go there
DEFAULT_HOST_FANOUT = 16
MAX_FORWARDED = 1 << 20  # engines a request's forward list may name (an input bound)
MAX_DEPTH = 32  # levels a forward list may nest (a plan of 16 per level needs 3 for 4,096 hosts)
DEAD_KEPT = 256  # lives of host relays found lost, remembered (a call passed on late is failed)


def plan(hosts: list, fanout: int) -> list[tuple[object, list]]:
    """``hosts`` as at most ``fanout`` trees, ``(head, [subtrees])``: the list
    cut in ``fanout`` runs; each run's first host heads the rest, cut alike.
    Every host is in exactly one place; no host has more than ``fanout`` below it."""
    size = len(hosts)
    k = min(fanout, size)
    runs = [hosts[i * size // k : (i + 1) * size // k] for i in range(k)]
    return [(run[0], plan(run[1:], fanout)) for run in runs]


@dataclass
class Forwarded:
    """One host a call is passed on to: its relay, its chunk socket, its own
    targets, the hosts it passes the call on to in turn (as sent), and every
    engine it owes (its own and theirs: the tree is walked once, as it is checked)."""

    ident: bytes
    url: str
    targets: list[int]
    below: list  # [[label, url, targets, below, boot], ...]
    boot: str | None  # the life of its relay the leaf last heard (a lost one is passed nothing)
    owed: list[int]


def parse_entry(entry, depth: int = 0) -> Forwarded:
    if not (
        isinstance(entry, list)
        and len(entry) == 5
        and isinstance(entry[0], str)
        and isinstance(entry[1], str)
        and entry[1].startswith("tcp://")
        and isinstance(entry[2], list)
        and all(type(e) is int for e in entry[2])
        and isinstance(entry[3], list)
        and (entry[4] is None or isinstance(entry[4], str))
    ):
        raise P.ProtocolError("a forward entry is [label, tcp url, [engine ids], [entries], boot]")
    if depth > MAX_DEPTH:
        raise P.ProtocolError(f"a forward list nested deeper than {MAX_DEPTH}")
    owed = list(entry[2])
    for below in entry[3]:
        owed += parse_entry(below, depth + 1).owed
    return Forwarded(HOST_PREFIX + entry[0].encode(), entry[1], entry[2], entry[3], entry[4], owed)


def parse(value) -> list[Forwarded]:
    """A request's ``forward`` list, checked whole (shape, no deeper than
    ``MAX_DEPTH``, no more than ``MAX_FORWARDED`` engines): raises ``ProtocolError``."""
    if not isinstance(value, list):
        raise P.ProtocolError("forward is not a list")
    entries = [parse_entry(e) for e in value]
    if sum(len(f.owed) for f in entries) > MAX_FORWARDED:
        raise P.ProtocolError(f"a forward list naming more than {MAX_FORWARDED} engines")
    return entries


RECEIPT = "ipb_receipt"  # a host relay passed a call says so to the host that passed it
REQUEST_MARK = b'"' + P.REQUEST.encode() + b'"'  # in the header frame of a call passed on
BUNDLE_MARK = b'"' + P.BUNDLE.encode() + b'"'  # ... of the outcomes coming back
RECEIPT_MARK = b'"' + RECEIPT.encode() + b'"'  # ... and of its receipt
ROUTE_MARK = b"ipb-passed"  # a call passed on: its outcomes' route is [ROUTE_MARK, url, label]


def passed(frames) -> bool:
    """Whether a message on a host relay's chunk socket is a call passed on, or
    outcomes coming back (else: a chunk, ``chunks_in``)."""
    try:
        body = P.split_idents(frames)[1]
    except P.ProtocolError:
        return False  # (``chunks_in`` drops it)
    header = P.as_bytes(body[1]) if len(body) > 1 else b""
    return REQUEST_MARK in header or BUNDLE_MARK in header or RECEIPT_MARK in header


def from_passing(codec: P.Codec, frames) -> E.Request | E.ChildMessage:
    """A call passed on (its replies' route: ``via``) or outcomes coming back
    (from the host relay the socket's identity names)."""
    body = P.split_idents(frames)[1]
    if REQUEST_MARK in (P.as_bytes(body[1]) if len(body) > 1 else b""):
        request = E.from_above(codec, frames, is_root=False, is_host=True)
        if not isinstance(request, E.Request):
            raise P.ProtocolError("a call passed on that is not a request")
        request.route = via_route(request.content.pop(VIA, None))  # (not the passing socket's identity)
        return request
    event = E.from_below(codec, frames, is_leaf=False)
    if event.kind not in (P.BUNDLE, RECEIPT) or not event.ident.startswith(HOST_PREFIX):
        raise P.ProtocolError(f"unexpected {event.kind!r} passed back by {event.ident!r}")
    return event


def via_route(via) -> list:
    """The route of a call passed on, from its ``via``: outcomes go to that host's chunk socket."""
    if not (
        isinstance(via, list)
        and len(via) == 2
        and isinstance(via[0], str)
        and isinstance(via[1], str)
        and via[1].startswith("tcp://")
    ):
        raise P.ProtocolError("via is [label, tcp url]")
    return [ROUTE_MARK, via[1].encode(), HOST_PREFIX + via[0].encode()]


def outbound(send: Send) -> Send:
    """A host relay's send up: outcomes of a call passed on go to the chunk
    socket of the host that passed it (``[url, its identity, *message]``)."""
    frames = send.frames
    if send.socket == UP and frames and isinstance(frames[0], bytes) and frames[0] == ROUTE_MARK:
        return Send(BULK, frames[1:])
    return send


class Forwarding:
    """A node's part in calls passed host to host. At a leaf: which hosts a
    call goes to by way of others (``split``), and whom to tell when one is
    lost. At a host relay: the hosts it passes a call on to (``pass_on``)."""

    def __init__(
        self,
        ctx: NodeContext,
        inflight: InFlight,
        children: Children,
        fanout: int,
        own_url: Callable[[], str | None],
        deadlines: Deadlines,
        timeout: float,
    ):
        self.ctx, self.inflight, self.children, self.fanout = ctx, inflight, children, fanout
        self.own_url = own_url  # a host relay's chunk socket (where outcomes come back)
        # calls passed on whose receipt has not come: (request key, host) -> by when it must
        self.timeout, self.unreceipted = timeout, {}
        self.unreachable: OrderedDict[str, None] = OrderedDict()  # boots of hosts no receipt came from
        deadlines.add("passed calls' receipts", self._next_receipt, self._unreceipted)
        self.dead: OrderedDict[str, None] = OrderedDict()  # boots of host relays found lost
        self.split_calls = self.passed = 0  # calls a leaf sent to heads only; calls a host relay passed on

    def stats(self) -> dict:
        return dict(calls_split=self.split_calls, calls_passed=self.passed)

    # -------------------------------------------------------------- leaf
    def split(self, p: Pending, groups: dict, mode) -> dict[bytes, tuple[list, list[int]]]:
        """Leaf: ``{head: (its forward list, the engines it owes)}`` for a call
        to more than ``fanout`` host relays (the others of ``groups`` then get
        nothing from here); ``{}``: each gets its request from here. Records
        who passes the call to whom (``p.forwarders``)."""
        bulk = self.children.bulk
        hosts = [k for k in groups if isinstance(k, bytes) and k in bulk]
        if (
            not self.fanout
            or len(hosts) <= self.fanout
            or mode
            or p.big
            or p.reduction is not None
            or p.own is not None
        ):
            return {}
        heads, p.forwarders = {}, {}
        self.split_calls += 1
        for head, below in plan(hosts, self.fanout):
            entries, owed = self._entries(p, head, below, groups)
            heads[head] = (entries, groups[head] + owed)
        return heads

    def _entries(self, p: Pending, forwarder: bytes, trees: list, groups: dict) -> tuple[list, list[int]]:
        entries, owed = [], []
        for host, below in trees:
            p.forwarders[host] = forwarder
            sub, sub_owed = self._entries(p, host, below, groups)
            label, boot = host[len(HOST_PREFIX) :].decode(), self.children.boots.get(host)
            entries.append([label, self.children.bulk[host], groups[host], sub, boot])
            owed += groups[host] + sub_owed
        return entries, owed

    @staticmethod
    def unanswered(key, lost: str, via: dict) -> Callable[[int], str]:
        """How an engine that ``key`` owed fails (``lost``: "Host relay h1 is
        unreachable"): one behind another host relay is named with it."""

        def phrase(eid: int) -> str:
            host = via.get(eid)
            if host is None or host == key:
                return f"{lost}; engine {eid} did not answer"
            below = host[len(HOST_PREFIX) :].decode(errors="replace")
            return f"{lost}; it was passing the call to host relay {below}, whose engine {eid} did not answer"

        return phrase

    def host_lost(self, key: bytes, why: str) -> list[Send]:
        """Leaf: host relay ``key`` is lost. Each host that was passing it a
        call is told (once), and fails what it waits on from it."""
        told = set()
        for p in self.inflight.requests.values():
            forwarder = p.forwarders.get(key) if p.forwarders else None
            if forwarder is not None and forwarder in self.children:
                told.add(forwarder)
        label = key[len(HOST_PREFIX) :].decode(errors="replace")
        notice = dict(host=label, boot=self.children.boots.get(key), why=why)
        return [Send(DOWN, [f] + self.ctx.codec.pack(P.LOST, notice)) for f in sorted(told)]

    # -------------------------------------------------------- host relay
    def pass_on(self, p: Pending, entries: list[Forwarded]) -> list[Send]:
        """Host relay: send ``p`` on to each host of ``entries``, which owes
        the outcomes of every host below it (one to a host found lost fails at once)."""
        sends = []
        self.passed += 1
        via = [self.ctx.host, self.own_url()]
        for f in entries:
            eids = f.owed
            label = f.ident[len(HOST_PREFIX) :].decode(errors="replace")
            if (f.boot is not None and f.boot in self.dead) or via[1] is None:
                why = f"is behind host relay {label}, lost before it was passed the call"
                sends += self.inflight.fail(p, eids, P.UNREACHABLE, why)
                continue
            if f.boot is not None and f.boot in self.unreachable:
                why = f"is behind host relay {label}, which {self.ctx.name} cannot reach ({f.url})"
                sends += self.inflight.fail(p, eids, P.UNREACHABLE, why)
                continue
            p.state.expect(f.ident, eids)
            self.unreceipted.pop((p.key, f.ident), None)  # (re-added last: the dict stays in due order)
            self.unreceipted[p.key, f.ident] = (self.ctx.clock() + self.timeout, f.boot, f.url)
            content, frames = p.request_for(f.targets, None)
            content[FORWARD], content[VIA] = f.below, via
            table, frames = P.join_small(frames)
            if table is not None:
                content[P.JOINED] = table
            sends.append(Send(BULK, [f.url.encode(), f.ident] + self.ctx.codec.pack(P.REQUEST, content, frames)))
        return sends

    def received(self, request: E.Request) -> list[Send]:
        """Host relay: a call passed on to it: its receipt, to the host that passed it."""
        receipt = self.ctx.codec.pack(RECEIPT, dict(req=request.content.get("req")))
        return [Send(BULK, request.route[1:] + receipt)]

    def receipt(self, host: bytes, content: dict) -> list[Send]:
        """Host relay: ``host`` got a call this relay passed it."""
        self.unreceipted.pop((content.get("req"), host), None)
        return []

    def _next_receipt(self) -> float | None:
        """The first due: entries go in in the order they fall due (one ``timeout`` after
        sending), so it is the oldest, read without a pass over every call in flight."""
        return next(iter(self.unreceipted.values()))[0] if self.unreceipted else None

    def _unreceipted(self, now: float) -> list[Send]:
        """Calls passed on whose receipt did not come in ``timeout``: the host
        cannot be reached from here (its relay port closed to this host, say);
        what it owes fails, and it is passed no more calls in that life."""
        sends = []
        while self.unreceipted:
            (key, host), (due, boot, url) = next(iter(self.unreceipted.items()))
            if due > now:
                break  # (the rest fall due later)
            del self.unreceipted[key, host]
            if boot is not None:
                self.unreachable[boot] = None
                while len(self.unreachable) > DEAD_KEPT:
                    self.unreachable.popitem(last=False)
            label = host[len(HOST_PREFIX) :].decode(errors="replace")
            why = f"Host relay {label} could not be reached from {self.ctx.name} ({url}) to pass it the call"
            sends += self.inflight.fail_waiting_on(host, P.UNREACHABLE, self.unanswered(None, why, {}), [key])
        return sends

    def lost(self, boot) -> None:
        """Host relay: the leaf said a host relay it may pass calls to is lost (that life of it)."""
        if isinstance(boot, str):
            self.dead[boot] = None
            while len(self.dead) > DEAD_KEPT:
                self.dead.popitem(last=False)
