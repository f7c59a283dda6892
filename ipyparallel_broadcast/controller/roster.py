"""The hub's engine roster, told whole to every client that connects.

A client takes its engine list from the hub's connection reply and every
later change from the hub's notifications, a PUB socket. ZeroMQ drops what
a PUB publishes before a new subscriber's subscription has reached it (the
"slow joiner"), so a client that connects while engines register missed
some of them for good (ipyparallel's design; ``docs/upstream-issues.md``).

Here the notification socket is an XPUB in manual mode: a subscription takes
effect only when the hub applies it, pipe by pipe, so the hub knows the moment
each subscriber is live and can send to that subscriber alone.

- Every notification carries ``ipb_seq`` (one more per notification) and
  ``ipb_epoch`` (this roster's) in its metadata, signed anew.
- A subscription to ``ROSTER_HELLO_PREFIX + anything`` (our clients') is
  answered, on that topic (so to that subscriber) only, by an ``ipb_roster`` message: the whole
  engine table and the sequence number it is at. Everything published after
  it reaches that client, so the table plus what follows is whole; a client
  that sees a gap in the numbers asks again the same way.
- A subscription to everything (``b""``, ipyparallel's clients) is applied as
  a subscription to the hub's own messages (``DELIM``), so no hello reaches
  it. The subscriber is sent, alone, the registrations it may have missed:
  those of engines registered after the oldest connection reply not yet
  matched with a subscription (replies and subscriptions are not paired on
  the wire; see ``UnmatchedReplies``). Unregistrations are not replayed: a stock
  client given one it never saw fails its ``wait_for_engines``.
- Engines a host relay registers (``hostreg``) are told in one
  ``ipb_registrations`` notification, numbered once, on a topic of its own
  (``BATCH_TOPIC``); those a silent relay takes with it, in one
  ``ipb_unregistrations`` (the hub's own notifications held meanwhile,
  ``RosterDoor.held``). Our clients subscribe to ``OURS_TOPIC`` after ``b""``,
  which takes their pipe off the stock copies and onto the batches. The
  per-engine copies ipyparallel's clients read (``STOCK_TOPIC``, the same
  number as their batch) are made only once a stock subscriber has come.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from contextlib import contextmanager

import zmq
from jupyter_client.session import Session
from zmq.eventloop.zmqstream import ZMQStream

from ..wire import protocol as P
from ..wire.naming import ROSTER_HELLO_PREFIX

log = logging.getLogger(__name__)
DELIM = P.HUB_TOPIC
REPLAY_TOPIC = b"ipb-roster-replay"  # the private topic of a stock subscriber's replay
REGISTERED, UNREGISTERED = P.REGISTERED, P.UNREGISTERED
OUTSTANDING = 256  # connection replies kept unmatched at most (the oldest dropped)
REPLY_WINDOW = 60.0  # seconds a connection reply waits for its client's subscription


class UnmatchedReplies:
    """The sequence numbers of connection replies whose client has not
    subscribed yet. A subscription cannot say which reply was its own; taking
    away the newest each time keeps, for every client still to subscribe, a
    number no later than its own (each client replies before it subscribes).

    A reply not matched within ``window`` seconds goes: its client died
    before it subscribed, or never does (ipyparallel's task scheduler asks
    after it subscribed). Left, the oldest stayed the oldest for good, and
    every later subscriber was replayed every registration since."""

    def __init__(self, limit: int = OUTSTANDING, window: float = REPLY_WINDOW):
        self.seqs: list[tuple[int, float]] = []  # (seq, when), oldest first
        self.limit, self.window = limit, window

    def add(self, seq: int, now: float):
        self.seqs.append((seq, now))
        if len(self.seqs) > self.limit:
            self.seqs.pop(0)

    def take(self, now: float) -> int | None:
        """The oldest unmatched reply's number (None if none), one reply fewer."""
        while self.seqs and now - self.seqs[0][1] > self.window:
            self.seqs.pop(0)
        if not self.seqs:
            return None
        oldest = self.seqs[0][0]  # (numbers only grow: the list is in their order)
        self.seqs.pop()
        return oldest


class Roster:
    """Sans-I/O: notifications out (stamped), subscriptions in (actions out).

    ``engines`` gives the hub's table ``{id: uuid}`` when asked. Actions are
    ``("subscribe" | "unsubscribe", topic)`` and ``("send", frames)``, to be
    done in order, at once, on the pipe whose subscription came in.
    """

    def __init__(self, session: Session, engines: Callable[[], dict], epoch: str | None = None, clock=time.monotonic):
        self.session, self.engines, self.clock = session, engines, clock
        self.epoch = epoch or secrets.token_hex(8)
        self.seq = 0
        self.registered_at: dict[int, int] = {}  # engine id -> the number of its registration
        self.replies = UnmatchedReplies()
        self.welcomes = self.replays = self.replayed = 0  # hellos answered; replays, registrations in them
        self.stock = 0  # subscribers to everything, less those that said they are ours (never below)
        self.held: dict[int, str] | None = None  # unregistrations held for one batch (``hold``), or None

    def stamp(self, frames: list) -> list | None:
        """A notification the hub serialized, with its number in its metadata,
        signed again; None if it is held for a batch (``hold``)."""
        frames = [P.as_bytes(f) for f in frames]
        at = frames.index(DELIM)
        header, parent, metadata, content = frames[at + 2 : at + 6]
        self.seq += 1
        unpack = self.session.unpack
        md = dict(unpack(metadata) or {}, **{P.SEQ_KEY: self.seq, P.EPOCH_KEY: self.epoch})
        kind, body = unpack(header).get("msg_type"), unpack(content)
        if kind == UNREGISTERED and self.held is not None:
            self.seq -= 1  # (numbered with its batch)
            self.held[int(body["id"])] = str(body["uuid"])
            return None
        if kind == REGISTERED:
            self.registered_at[int(body["id"])] = self.seq
        elif kind == UNREGISTERED:
            self.registered_at.pop(int(body["id"]), None)
        parts = [header, parent, self.session.pack(md), content]
        return frames[:at] + [DELIM, self.session.sign(parts)] + parts + frames[at + 6 :]

    def replied(self):
        """A connection reply went out: its engine table is as of now."""
        self.replies.add(self.seq, self.clock())

    def table(self) -> dict:
        return {str(eid): uuid for eid, uuid in self.engines().items()}

    def subscription(self, frame: bytes) -> list[tuple]:
        """What to do about one subscription message of the XPUB."""
        if not frame or frame[0] not in (0, 1):
            return []
        on, topic = frame[0] == 1, frame[1:]
        if topic == P.OURS_TOPIC:
            if not on:
                return []
            self.stock = max(0, self.stock - 1)
            return [("unsubscribe", P.STOCK_TOPIC), ("subscribe", P.BATCH_TOPIC)]
        if not on:
            return [("unsubscribe", DELIM), ("unsubscribe", P.STOCK_TOPIC)] if not topic else [("unsubscribe", topic)]
        if topic.startswith(ROSTER_HELLO_PREFIX):
            self.welcomes += 1
            msg = self.session.msg(P.ROSTER, content=dict(engines=self.table(), seq=self.seq, epoch=self.epoch))
            return [("subscribe", topic), ("send", self.session.serialize(msg, ident=[topic]))]
        if topic:
            return [("subscribe", topic)]
        self.stock += 1
        return [("subscribe", DELIM), ("subscribe", P.STOCK_TOPIC)] + self._replay(self.replies.take(self.clock()))

    def registrations(self, engines: dict[int, str]) -> list[list]:
        """One host's engines registered: the batch, and a copy per engine
        for stock subscribers if any came; all of them one notification."""
        out = self._batch(P.REGISTRATIONS, REGISTERED, engines)
        for eid in engines:
            self.registered_at[eid] = self.seq
        return out

    def hold(self) -> None:
        """The hub's unregistrations from now on held, for ``unregistrations``."""
        self.held = {}

    def unregistrations(self) -> list[list]:
        """The unregistrations held since ``hold``, told as one notification
        (as ``registrations``); nothing if there were none."""
        engines, self.held = self.held or {}, None
        for eid in engines:
            self.registered_at.pop(eid, None)
        return self._batch(P.UNREGISTRATIONS, UNREGISTERED, engines) if engines else []

    def _batch(self, kind: str, each: str, engines: dict[int, str]) -> list[list]:
        self.seq += 1
        md = {P.SEQ_KEY: self.seq, P.EPOCH_KEY: self.epoch}
        batch = self.session.msg(kind, content=dict(engines={str(e): u for e, u in engines.items()}), metadata=md)
        out = [self.session.serialize(batch, ident=[P.BATCH_TOPIC])]
        if self.stock:
            for eid, uuid in engines.items():
                msg = self.session.msg(each, content=dict(id=eid, uuid=uuid), metadata=md)
                out.append(self.session.serialize(msg, ident=[P.STOCK_TOPIC]))
        return out

    def _replay(self, since: int | None) -> list[tuple]:
        """Registrations after ``since``, to the new stock subscriber alone."""
        if since is None:
            return []
        table, sends = self.engines(), []
        topic = REPLAY_TOPIC + b":%d" % self.replays  # this subscriber's alone
        for eid, seq in self.registered_at.items():
            if seq > since and eid in table:
                content = dict(id=eid, uuid=table[eid])
                msg = self.session.msg(REGISTERED, content=content, metadata={P.SEQ_KEY: seq, P.EPOCH_KEY: self.epoch})
                sends.append(("send", self.session.serialize(msg, ident=[topic])))
        self.replayed += len(sends)
        if not sends:
            return []
        self.replays += 1
        return [("subscribe", topic), *sends]


class RosterDoor(ZMQStream):
    """The hub's notifier: an XPUB in manual mode that stamps what the hub
    publishes and answers subscriptions as ``Roster`` says, on the hub's loop.

    Every message goes through the stream's queue, in order, and the queue is
    flushed at once (``flush``, which then looks for subscriptions waiting):
    a send on the socket behind the stream's back can take ZeroMQ's
    edge-triggered read event, and subscriptions would wait unread (a client
    never welcomed, found at 1,024 engines); left to the loop, the queue goes
    one message per turn, and a burst of thousands held a hello for seconds.
    A topic given to one pipe stays, unique to it, until its subscriber lets
    it go or leaves."""

    def __init__(self, socket: zmq.Socket, loop, roster: Roster):
        socket.setsockopt(zmq.XPUB_MANUAL, 1)
        socket.SNDHWM = 0  # as ipyparallel's notifier: nothing dropped for a slow subscriber
        super().__init__(socket, loop)
        self.roster = roster
        self.on_recv(self._on_subscription)

    def send_multipart(self, msg, *args, **kwargs):
        """The hub's notifications, stamped (or held for a batch)."""
        frames = self.roster.stamp(list(msg))
        if frames is not None:
            super().send_multipart(frames, *args, **kwargs)
            self.flush(zmq.POLLOUT)

    def publish_registrations(self, engines: dict[int, str]):
        """One host's engines registered (``hostreg``), told as ``Roster.registrations`` says."""
        self._publish(self.roster.registrations(engines))

    @contextmanager
    def held(self):
        """The hub's unregistrations inside told as one batch at the end (a lost host's)."""
        self.roster.hold()
        try:
            yield
        finally:
            self._publish(self.roster.unregistrations())

    def _publish(self, messages: list[list]):
        for frames in messages:
            super().send_multipart(frames)
        self.flush(zmq.POLLOUT)

    def _on_subscription(self, frames):
        try:
            actions = self.roster.subscription(P.as_bytes(frames[0]))
        except Exception:
            log.exception("roster: a subscription could not be answered")
            return
        for action, arg in actions:  # subscriptions at once: they apply to the pipe that just subscribed
            if action == "send":
                super().send_multipart(arg)  # (queued behind what the hub sent before)
            else:
                self.socket.setsockopt(zmq.SUBSCRIBE if action == "subscribe" else zmq.UNSUBSCRIBE, arg)
        self.flush(zmq.POLLOUT)
