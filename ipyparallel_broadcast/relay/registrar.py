"""A host relay's registrar: its engines register with the hub by host.

An engine behind a host relay sends ipyparallel's own ``registration_request``
to the relay (``Place.register_url``), not to the hub. The relay sends the hub
one ``ipb_host_engines`` message for every engine waiting; while one is in
flight the next ones wait for its answer, so engines that start together
register in a few messages, whatever their number. The hub grants the ids in
one step and answers in one message (``controller.hostreg``); each engine
gets ipyparallel's ``registration_reply``, as the hub would have sent it.
An engine is filed by the hub once the relay tells it that its heart beats
(``enginehearts``): by then it has joined the relay and connected its
sockets. That, and the engines the relay finds gone (their process ended, or
they asked to unregister), go up in the same batches. The hub's notice that it dropped an engine
(``ipb_dropped``) comes down to that engine.

Sans-I/O: frames in, ``Send`` out, to ``ENGINES`` (the relay's registration
socket, ROUTER) or ``HUB`` (a DEALER to the hub's registration socket).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..host.link import JOIN_TIMEOUT
from ..wire import protocol as P
from .events import Send

ENGINES, HUB = "registrar-engines", "registrar-hub"
REPLY_TIMEOUT = 10.0  # seconds without the hub's answer: the batch is sent again (the hub's is idempotent)


class Registrar:
    """One host's registrations and departures, one batch in flight."""

    def __init__(self, codec: P.Codec, host: str, clock: Callable[[], float] = time.monotonic):
        self.codec, self.host, self.clock = codec, host, clock
        self.waiting: dict[str, tuple[list, int | None]] = {}  # uuid -> (the engine's idents, id asked for)
        self.gone: set[str] = set()  # uuids of engines gone, for the hub
        self.beats: set[str] = set()  # uuids of engines whose heart began to beat, for the hub
        self.sent: dict[str, tuple[list, int | None]] = {}  # the batch in flight (registrations)
        self.sent_gone: set[str] = set()
        self.sent_beats: set[str] = set()
        self.sent_at: float | None = None
        self.granted: dict[str, int] = {}  # uuid -> id, of engines registered through this relay
        self.unjoined: dict[str, float] = {}  # uuid -> when granted, of engines yet to join the relay
        self.asked_at: float | None = None  # when an engine last asked to register
        self.batches = self.engines_registered = 0

    # -------------------------------------------------------------- engines
    def from_engine(self, frames) -> list[Send]:
        """ipyparallel's registration or unregistration request, from an engine of this host."""
        idents, body = P.split_idents(frames)
        msg = self.codec.unpack(body)
        kind, content = msg["header"].get("msg_type"), msg["content"]
        if kind == "registration_request":
            uuid, asked = content.get("uuid"), content.get("id")
            if not isinstance(uuid, str) or not (asked is None or type(asked) is int):
                raise P.ProtocolError("registration request without a uuid")
            self.gone.discard(uuid)
            self.waiting[uuid] = ([P.as_bytes(i) for i in idents], asked)
            self.asked_at = self.clock()
            return self.flush()
        if kind == "unregistration_request":
            eid = content.get("id")
            uuid = next((u for u, e in self.granted.items() if e == eid), None)
            return self.lost([uuid]) if uuid is not None else []
        raise P.ProtocolError(f"unexpected {kind!r} on the registration socket")

    def lost(self, uuids) -> list[Send]:
        """Engines of this host that are gone: the hub unregisters them."""
        for uuid in uuids:  # (a relay restarted has granted none: the hub checks whose they were)
            self.waiting.pop(uuid, None)
            self.granted.pop(uuid, None)
            self.unjoined.pop(uuid, None)
            self.beats.discard(uuid)
            self.gone.add(uuid)
        return self.flush()

    def beating(self, uuids) -> list[Send]:
        """Engines whose heart answered the relay for the first time: the hub files them."""
        self.beats.update(uuids)
        return self.flush()

    # ------------------------------------------------------------------ hub
    def flush(self) -> list[Send]:
        """The next batch, if none is in flight and one is due."""
        if self.sent_at is not None or not (self.waiting or self.gone or self.beats):
            return []
        self.sent, self.waiting = self.waiting, {}
        self.sent_gone, self.gone = self.gone, set()
        self.sent_beats, self.beats = self.beats, set()
        self.sent_at = self.clock()
        self.batches += 1
        content = dict(
            host=self.host,
            engines=[dict(uuid=u, id=asked) for u, (_, asked) in self.sent.items()],
            gone=sorted(self.sent_gone),
            beating=sorted(self.sent_beats),
        )
        return [Send(HUB, self.codec.pack(P.HOST_ENGINES, content))]

    def hello(self) -> list[Send]:
        """A relay (re)started tells the hub where it is, with nothing to register."""
        if self.sent_at is not None:
            return []
        self.sent_at = self.clock()
        return [Send(HUB, self.codec.pack(P.HOST_ENGINES, dict(host=self.host, engines=[], gone=[], beating=[])))]

    def from_hub(self, frames) -> list[Send]:
        """The hub's answer to a batch, or its notice that it dropped an engine."""
        msg = self.codec.unpack(P.split_idents(frames)[1])
        kind, content = msg["header"].get("msg_type"), msg["content"]
        if kind == P.DROPPED:
            uuid = content.get("uuid")
            if not isinstance(uuid, str):
                raise P.ProtocolError("a drop notice without the engine's uuid")
            self.granted.pop(uuid, None)
            return [Send(ENGINES, [uuid.encode(), *self.codec.pack(P.DROPPED, {})])]
        if kind != P.HOST_ENGINES_REPLY or not isinstance(content.get("engines"), list):
            raise P.ProtocolError(f"unexpected {kind!r} from the hub")
        common = {k: content[k] for k in ("hb_period", "connection_info") if k in content}
        sends = []
        for answer in content["engines"]:
            uuid = answer.get("uuid") if isinstance(answer, dict) else None
            if uuid not in self.sent:
                continue  # (an answer to a batch sent again)
            idents, _ = self.sent.pop(uuid)
            reply = {k: v for k, v in answer.items() if k != "uuid"}
            if reply.get("status") == "ok":
                if type(reply.get("id")) is not int:
                    raise P.ProtocolError("a granted registration without an id")
                self.granted[uuid], self.unjoined[uuid] = reply["id"], self.clock()
                self.engines_registered += 1
                reply.update(common)
            sends.append(Send(ENGINES, idents + self.codec.pack("registration_reply", reply)))
        self.waiting = {**self.sent, **self.waiting}  # not answered: in the next batch
        self.sent, self.sent_gone, self.sent_beats, self.sent_at = {}, set(), set(), None
        return sends + self.flush()

    def joined(self, uuids) -> None:
        """Engines that joined the relay: registered, and served."""
        for uuid in uuids:
            self.unjoined.pop(uuid, None)

    def registering(self) -> bool:
        """Whether engines of this host are registering: waiting, in a batch in
        flight, or granted an id and not joined yet (each for as long as an
        engine waits: ``JOIN_TIMEOUT``). A relay with no engine but these must
        not exit: their registrations would go with it, unanswered. (Past that,
        a hub that does not answer has lost them: the engines gave up.)"""
        now = self.clock()
        for uuid, granted_at in list(self.unjoined.items()):
            if now - granted_at > JOIN_TIMEOUT:  # it will not join (it died, or gave up)
                del self.unjoined[uuid]
        asking = bool(self.waiting or self.sent) and now - self.asked_at <= JOIN_TIMEOUT
        return asking or bool(self.unjoined)

    # ---------------------------------------------------------------- timing
    def next_deadline(self) -> float | None:
        return None if self.sent_at is None else self.sent_at + REPLY_TIMEOUT

    def on_tick(self) -> list[Send]:
        """No answer in time (the hub restarting, a message lost): send the batch again."""
        if self.sent_at is None or self.clock() < self.sent_at + REPLY_TIMEOUT:
            return []
        self.waiting = {**self.sent, **self.waiting}
        self.gone |= self.sent_gone
        self.beats |= self.sent_beats
        self.sent, self.sent_gone, self.sent_beats, self.sent_at = {}, set(), set(), None
        return self.flush()

    def stats(self) -> dict:
        return dict(registration_batches=self.batches, registered_here=self.engines_registered)
