"""A relay node's heartbeats, a part that owns its state: pings to its
children, pongs to its parent, the pulse link of host relays (``children``),
a client's pings about its requests, and a host relay's hello when its leaf
falls silent. Sans I/O; it reaches the node only through what it is given.

A ping to a relay-node child lists the requests it owed at the last ping too
(``keys``); its pong names those it does not hold (``unknown``), and they fail
at once. Pings follow requests on the same link, so an unknown one was lost:
the child restarted (before its parent knew its boot: a parent that restarted
learns it from the first pong, so that pong is answered with a ping listing all
the child owes), or it dropped the request. Host relays are left out: their
pings may go on the pulse link, beside the requests."""

from __future__ import annotations

from collections.abc import Callable

from ..wire import protocol as P
from . import events as E
from .children import Children
from .context import NodeContext
from .deadlines import Deadlines
from .events import DOWN, PULSE, UP, Send
from .inflight import InFlight
from .routes import Key


class Heartbeats:
    """Pings, pongs and greetings of one relay node.

    ``child_lost(key, why)`` fails what waits on a child; ``inflight`` has
    the requests in flight here (and what each waits on); ``held()`` gives the
    msg_ids of the requests (and surveys) held here; ``reannounce()`` tells the parent again
    which engines are here; ``parent_restarted()`` lets go of what the parent's
    old life led (chains and rings)."""

    def __init__(
        self,
        ctx: NodeContext,
        children: Children,
        deadlines: Deadlines,
        inflight: InFlight,
        *,
        child_lost: Callable[[Key, str], list[Send]],
        held: Callable[[], set],
        reannounce: Callable[[], list[Send]],
        parent_restarted: Callable[[], list[Send]],
    ):
        self.ctx, self.children = ctx, children
        ping_interval, node_timeout = children.ping_interval, children.node_timeout
        self.ping_interval, self.node_timeout = ping_interval, node_timeout
        self.child_lost, self.held, self.inflight = child_lost, held, inflight
        self.owed: dict[Key, set[str]] = {}  # relay-node child -> keys it owed at the last ping
        self.reannounce, self.parent_restarted = reannounce, parent_restarted
        self.parent_boot: str | None = None  # a new one: the parent restarted
        self.pulse_port: int | None = None  # the shell's pulse link for host relays, if bound
        self.parent_pulse: int | None = None  # host relay: the parent's pulse port, once told
        self.bulk_url: str | None = None  # a host relay's chunk socket (the shell's), said in its pongs
        # host relay: when its leaf last pinged it. A leaf that restarted does
        # not know its host relays; each says hello again when its leaf is silent
        self.parent_heard: float | None = ctx.clock() if ctx.host else None
        self.parent_silence = min(node_timeout, 3 * ping_interval)  # three pings missed
        deadlines.add("pings", lambda: children.next_ping, self._ping)
        deadlines.add("parent silence", self._silence_ends, self._parent_silent)

    def links(self, pulse_port: int | None = None, bulk_url: str | None = None) -> None:
        """The shell's sockets this node's pings and pongs name: a leaf's pulse
        port for its host relays, a host relay's chunk socket."""
        if pulse_port is not None:
            self.pulse_port = pulse_port
        if bulk_url is not None:
            self.bulk_url = bulk_url

    def hello(self, unknown: list | None = None) -> list[Send]:
        """Tell the parent this node is alive, and which life of it this is
        (and, asked, which requests it does not hold)."""
        ctx = self.ctx
        if ctx.is_root:
            return []
        pong = dict(node=ctx.name, boot=ctx.boot, bulk=self.bulk_url)
        if unknown is not None:
            pong["unknown"] = unknown
        return [Send(UP, ctx.codec.pack(P.PONG, pong))]

    # ------------------------------------------------------------ children
    def _ping(self, now: float) -> list[Send]:
        sends = []
        for key in self.children.silent(now):
            sends += self.child_lost(key, f"has not answered for {self.node_timeout:g} s")
        codec, content = self.ctx.codec, self._ping_content()
        ping, children = codec.pack(P.PING, content), self.children
        for key in children.on_data_link():
            keys = self._owed_since_last_ping(key)
            sends.append(Send(DOWN, [children.idents[key]] + (self._asking(keys) if keys else ping)))
        if children.pulsing:  # signed apart: the same message twice would be a replay
            ping = codec.pack(P.PING, content)
            sends += [Send(PULSE, [children.idents[k]] + ping) for k in children.pulsing]
        children.after_pings()
        return sends

    def _owed_since_last_ping(self, child: Key) -> list[str]:
        """A relay-node child: the requests it owes that it owed at the last ping too."""
        if isinstance(child, bytes):
            return []
        owed = self.inflight.owed_by(child)
        since, self.owed[child] = owed & self.owed.get(child, set()), owed
        return sorted(since)

    def _ping_content(self, **more) -> dict:
        return dict(boot=self.ctx.boot, pulse=self.pulse_port, every=self.children.interval, **more)

    def _asking(self, keys: list[str]) -> list:
        """A ping that asks a child whether it holds ``keys`` (signed for it alone)."""
        return self.ctx.codec.pack(P.PING, self._ping_content(keys=keys))

    def pong(self, child: Key, content: dict, pulse: bool = False) -> list[Send]:
        """A child's pong (it spoke: ``children.heard`` is set already), on the
        data link or (``pulse``) the pulse link."""
        boot, bulk, unknown = content.get("boot"), content.get("bulk"), content.get("unknown")
        if not isinstance(boot, str):
            raise P.ProtocolError("pong without a boot id")
        if unknown is not None and not (isinstance(unknown, list) and all(isinstance(k, str) for k in unknown)):
            raise P.ProtocolError("pong whose unknown requests are not a list of keys")
        if isinstance(child, bytes):
            self.children.bulk_link(child, bulk)
            if not pulse:
                self.children.data_pong(child)
        first = not self.children.knows_boot(child)
        if self.children.pong(child, boot):
            return self.child_lost(child, "restarted")
        if isinstance(child, bytes):  # (host relays are not asked for requests: see above)
            return []
        sends = self._lost(child, unknown) if unknown else []
        owed = sorted(self.inflight.owed_by(child)) if first else None
        return sends + ([Send(DOWN, [self.children.idents[child]] + self._asking(owed))] if owed else [])

    def _lost(self, child: Key, keys: list[str]) -> list[Send]:
        """The requests ``keys`` that ``child`` does not hold: what they wait on from it fails."""
        phrase = self.children.phrase(child)
        why = lambda eid: f"{phrase} lost the request (it restarted or dropped it); engine {eid} did not answer"  # noqa: E731
        return self.inflight.fail_waiting_on(child, P.UNREACHABLE, why, keys)

    def on_pulse(self, frames) -> list[Send]:
        """A host relay's pong on the pulse link (see ``children``)."""
        try:
            event = E.from_below(self.ctx.codec, frames, False)
            key = self.children.key_of(event.ident) if isinstance(event, E.ChildMessage) else None
            if not isinstance(key, bytes) or event.kind != P.PONG:
                raise P.ProtocolError("only pongs of known host relays come on the pulse link")
            self.children.pulse_heard(key)
            return self.pong(key, event.content(self.ctx.codec), pulse=True)
        except P.ProtocolError as e:
            return self.ctx.drop(f"pulse: {e}")

    # -------------------------------------------------------------- parent
    def on_parent_pulse(self, frames) -> list[Send]:
        """A ping on the pulse link (a host relay's): the pong goes back that way."""
        ctx = self.ctx
        try:
            event = E.from_above(ctx.codec, frames, ctx.is_root, bool(ctx.host))
            if not isinstance(event, E.Ping) or ctx.is_root:
                raise P.ProtocolError("only pings come on the pulse link")
            return self.parent_ping(event.content, via=PULSE)
        except P.ProtocolError as e:
            return ctx.drop(f"pulse: {e}")

    def client_ping(self, event: E.Ping) -> list[Send]:
        """A client lists requests it waits on: answer with those not held here."""
        ids = event.content.get("ids")
        if not isinstance(ids, list):
            raise P.ProtocolError("client ping without a list of ids")
        held = self.held()
        pong = dict(node=self.ctx.name, boot=self.ctx.boot, unknown=[m for m in ids if m not in held])
        return [Send(UP, event.route + self.ctx.codec.pack(P.PONG, pong))]

    def parent_ping(self, content: dict, via: str = UP) -> list[Send]:
        """Answer the parent; a parent that restarted hears our routes again."""
        boot, keys = content.get("boot"), content.get("keys")
        if keys is not None and not (isinstance(keys, list) and all(isinstance(k, str) for k in keys)):
            raise P.ProtocolError("ping whose keys are not a list of request keys")
        unknown = None if keys is None else [k for k in keys if k not in self.inflight.requests]
        sends = [Send(via, s.frames) for s in self.hello(unknown)]
        if self.parent_heard is not None:
            self.parent_heard = self.ctx.clock()
        every = content.get("every")  # the parent's pings' interval (stretched with its children)
        if type(every) in (int, float) and every > 0:
            self.parent_silence = min(self.node_timeout, 3 * max(self.ping_interval, every))
        pulse = content.get("pulse")
        if self.ctx.host and type(pulse) is int and 0 < pulse < 65536 and pulse != self.parent_pulse:
            self.parent_pulse = pulse  # the shell connects to it; a pong says who we are there
            sends += [Send(PULSE, s.frames) for s in self.hello()]
        if isinstance(boot, str):
            known, self.parent_boot = self.parent_boot, boot
            if known is not None and known != boot:  # (it holds none of the requests it had)
                sends += self.reannounce() + self.parent_restarted()
        return sends

    def _silence_ends(self) -> float | None:
        return None if self.parent_heard is None else self.parent_heard + self.parent_silence

    def _parent_silent(self, now: float) -> list[Send]:
        self.parent_heard = now  # again after as long, until a ping comes
        self.parent_pulse = None  # (its pings stopped: the next one on the data link tells it again)
        return self.hello() + self.reannounce()
