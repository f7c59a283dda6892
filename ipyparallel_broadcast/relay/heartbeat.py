"""A relay node's heartbeats, a part that owns its state: pings to its
children, pongs to its parent, the pulse link of host relays (``liveness``),
a client's pings about its requests, and a host relay's hello when its leaf
falls silent. Sans I/O; it reaches the node only through what it is given."""

from __future__ import annotations

from collections.abc import Callable

from ..wire import protocol as P
from . import events as E
from .context import NodeContext
from .deadlines import Deadlines
from .events import DOWN, PULSE, UP, Send
from .liveness import Children
from .routes import Key


class Heartbeats:
    """Pings, pongs and greetings of one relay node.

    ``child_lost(key, why)`` fails what waits on a child; ``held()`` gives the
    msg_ids of the requests held here; ``reannounce()`` tells the parent again
    which engines are here; ``parent_restarted()`` lets go of what the parent's
    old life led (chains and rings)."""

    def __init__(
        self,
        node: NodeContext,
        children: Children,
        deadlines: Deadlines,
        *,
        child_lost: Callable[[Key, str], list[Send]],
        held: Callable[[], set],
        reannounce: Callable[[], list[Send]],
        parent_restarted: Callable[[], list[Send]],
    ):
        self.node, self.children = node, children
        ping_interval, node_timeout = children.ping_interval, children.node_timeout
        self.ping_interval, self.node_timeout = ping_interval, node_timeout
        self.child_lost, self.held = child_lost, held
        self.reannounce, self.parent_restarted = reannounce, parent_restarted
        self.parent_boot: str | None = None  # a new one: the parent restarted
        self.pulse_port: int | None = None  # the shell's pulse link for host relays, if bound
        self.parent_pulse: int | None = None  # host relay: the parent's pulse port, once told
        self.bulk_url: str | None = None  # a host relay's chunk socket (the shell's), said in its pongs
        # host relay: when its leaf last pinged it. A leaf that restarted does
        # not know its host relays; each says hello again when its leaf is silent
        self.parent_heard: float | None = node.clock() if node.host else None
        self.parent_silence = min(node_timeout, 3 * ping_interval)  # three pings missed
        deadlines.add("pings", lambda: children.next_ping, self._ping)
        deadlines.add("parent silence", self._silence_ends, self._parent_silent)

    def hello(self) -> list[Send]:
        """Tell the parent this node is alive, and which life of it this is."""
        node = self.node
        if node.is_root:
            return []
        return [Send(UP, node.codec.pack(P.PONG, dict(node=node.name, boot=node.boot, bulk=self.bulk_url)))]

    # ------------------------------------------------------------ children
    def _ping(self, now: float) -> list[Send]:
        sends = []
        for key in self.children.silent(now):
            sends += self.child_lost(key, f"has not answered for {self.node_timeout:g} s")
        codec, content = self.node.codec, dict(boot=self.node.boot, pulse=self.pulse_port, every=self.children.interval)
        ping, children = codec.pack(P.PING, content), self.children
        sends += [Send(DOWN, [children.idents[k]] + ping) for k in children.on_data_link()]
        if children.pulsing:  # signed apart: the same message twice would be a replay
            ping = codec.pack(P.PING, content)
            sends += [Send(PULSE, [children.idents[k]] + ping) for k in children.pulsing]
        children.after_pings()
        return sends

    def pong(self, child: Key, content: dict, pulse: bool = False) -> list[Send]:
        """A child's pong (it spoke: ``children.heard`` is set already), on the
        data link or (``pulse``) the pulse link."""
        boot, bulk = content.get("boot"), content.get("bulk")
        if not isinstance(boot, str):
            raise P.ProtocolError("pong without a boot id")
        if isinstance(child, bytes):
            self.children.bulk_link(child, bulk)
            if not pulse:
                self.children.data_pong(child)
        return self.child_lost(child, "restarted") if self.children.pong(child, boot) else []

    def on_pulse(self, frames) -> list[Send]:
        """A host relay's pong on the pulse link (see ``liveness``)."""
        try:
            event = E.from_below(self.node.codec, frames, False)
            key = self.children.key_of(event.ident) if isinstance(event, E.ChildMessage) else None
            if not isinstance(key, bytes) or event.kind != P.PONG:
                raise P.ProtocolError("only pongs of known host relays come on the pulse link")
            self.children.pulsing.add(key)
            self.children.heard[key] = self.node.clock()
            return self.pong(key, event.content(self.node.codec), pulse=True)
        except P.ProtocolError as e:
            return self.node.drop(f"pulse: {e}")

    # -------------------------------------------------------------- parent
    def on_parent_pulse(self, frames) -> list[Send]:
        """A ping on the pulse link (a host relay's): the pong goes back that way."""
        node = self.node
        try:
            event = E.from_above(node.codec, frames, node.is_root, bool(node.host))
            if not isinstance(event, E.Ping) or node.is_root:
                raise P.ProtocolError("only pings come on the pulse link")
            return self.parent_ping(event.content, via=PULSE)
        except P.ProtocolError as e:
            return node.drop(f"pulse: {e}")

    def client_ping(self, event: E.Ping) -> list[Send]:
        """A client lists requests it waits on: answer with those not held here."""
        ids = event.content.get("ids")
        if not isinstance(ids, list):
            raise P.ProtocolError("client ping without a list of ids")
        held = self.held()
        pong = dict(node=self.node.name, boot=self.node.boot, unknown=[m for m in ids if m not in held])
        return [Send(UP, event.route + self.node.codec.pack(P.PONG, pong))]

    def parent_ping(self, content: dict, via: str = UP) -> list[Send]:
        """Answer the parent; a parent that restarted hears our routes again."""
        boot, sends = content.get("boot"), [Send(via, s.frames) for s in self.hello()]
        if self.parent_heard is not None:
            self.parent_heard = self.node.clock()
        every = content.get("every")  # the parent's pings' interval (stretched with its children)
        if type(every) in (int, float) and every > 0:
            self.parent_silence = min(self.node_timeout, 3 * max(self.ping_interval, every))
        pulse = content.get("pulse")
        if self.node.host and type(pulse) is int and 0 < pulse < 65536 and pulse != self.parent_pulse:
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
