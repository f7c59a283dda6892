"""A relay node's heartbeats: pings to its children, pongs to its parent,
the pulse link of host relays, a client's pings about its requests, and the
greetings that tell a parent which engines a node serves. Part of
``RelayNode`` (``core``); sans I/O like the rest."""

from __future__ import annotations

import logging

from ..wire import protocol as P
from . import events as E
from .events import DOWN, PULSE, UP, Send

log = logging.getLogger("ipyparallel_broadcast.relay.core")


class Heartbeats:
    """Pings, pongs and greetings of one relay node."""

    def hello(self) -> list[Send]:
        """Tell the parent this node is alive, and which life of it this is."""
        if self.is_root:
            return []
        return [Send(UP, self.codec.pack(P.PONG, dict(node=self.name, boot=self.boot, bulk=self.bulk_url)))]

    def _ping(self, now) -> list[Send]:
        sends = []
        for key in self.children.silent(now):
            sends += self.on_child_lost(key, f"has not answered for {self.node_timeout:g} s")
        ping = self.codec.pack(P.PING, dict(boot=self.boot, pulse=self.pulse_port))
        sends += [Send(DOWN, [ident] + ping) for ident in self.children.idents.values()]
        if self.children.pulsing:  # signed apart: the same message twice would be a replay
            ping = self.codec.pack(P.PING, dict(boot=self.boot, pulse=self.pulse_port))
            sends += [Send(PULSE, [self.children.idents[k]] + ping) for k in self.children.pulsing]
        self.children.after_pings()
        return sends

    def on_pulse(self, frames) -> list[Send]:
        """A host relay's pong on the pulse link (see ``liveness``)."""
        try:
            event = E.from_below(self.codec, frames, False)
            key = self.children.key_of(event.ident) if isinstance(event, E.ChildMessage) else None
            if not isinstance(key, bytes) or event.kind != P.PONG:
                raise P.ProtocolError("only pongs of known host relays come on the pulse link")
            self.children.pulsing.add(key)
            return self._child_message(event)
        except P.ProtocolError as e:
            return self._drop(f"pulse: {e}")

    def on_parent_pulse(self, frames) -> list[Send]:
        """A ping on the pulse link (a host relay's): the pong goes back that way."""
        try:
            event = E.from_above(self.codec, frames, self.is_root, bool(self.host))
            if not isinstance(event, E.Ping) or self.is_root:
                raise P.ProtocolError("only pings come on the pulse link")
            return self._parent_ping(event.content, via=PULSE)
        except P.ProtocolError as e:
            return self._drop(f"pulse: {e}")

    def _client_ping(self, event: E.Ping) -> list[Send]:
        """A client lists requests it waits on: answer with those not held here."""
        ids = event.content.get("ids")
        if not isinstance(ids, list):
            raise P.ProtocolError("client ping without a list of ids")
        held = {p.msg_id for p in self.pending.values()} | self.surveys.msg_ids()
        pong = dict(node=self.name, boot=self.boot, unknown=[m for m in ids if m not in held])
        return [Send(UP, event.route + self.codec.pack(P.PONG, pong))]

    def _parent_ping(self, content, via=UP) -> list[Send]:
        """Answer the parent; a parent that restarted hears our routes again."""
        boot, sends = content.get("boot"), [Send(via, s.frames) for s in self.hello()]
        if self.parent_heard is not None:
            self.parent_heard = self.clock()
        pulse = content.get("pulse")
        if self.host and type(pulse) is int and 0 < pulse < 65536 and pulse != self.parent_pulse:
            self.parent_pulse = pulse  # the shell connects to it; a pong says who we are there
            sends += [Send(PULSE, s.frames) for s in self.hello()]
        if isinstance(boot, str):
            known, self.parent_boot = self.parent_boot, boot
            if known is not None and known != boot:  # (it holds none of the requests it had)
                sends += self.announce.again(self.engines)
                sends += self._chains_end(list(self.chains.links) + self.rings.everything(), "the leaf restarted")
        return sends

    def _greet(self, eids) -> list[Send]:
        """Ask engines served here (not through a host relay) whether they share our memory."""
        return self.sharing.greet(
            [self.engines[e] for e in eids if e in self.engines and e not in self.routes.via and self._serves(e)]
        )

    def _engines_served(self) -> int:
        if self.host:
            return len(self.engines)
        via = self.routes.via
        return sum(1 for e in self.engines if e not in via and self.shape.serves(self.path, e))
