"""A client's engine table made whole, whenever it connects.

The hub's connection reply lists the engines registered then; later ones
come as notifications, on a PUB socket that drops what it sends before a new
subscriber's subscription has reached it. A client that connects while
engines register (or unregister) missed some for good, and ``rc.ids``,
views on "all" and ``wait_for_engines`` never saw them (ipyparallel's design;
``docs/upstream-issues.md``).

On our controller (``controller.roster``), once the client's subscription
is live it subscribes to a hello topic of its own, and the hub answers on it
with the whole table and the number of the last notification. Every
notification is numbered: one that skips a number (or comes from another
roster, a controller restarted) makes the client ask again. The client waits
for the first table when it connects (``roster_timeout``), so ``rc.ids`` is
whole as soon as ``Client()`` returns.
"""

from __future__ import annotations

import logging
import threading

import zmq

from ..wire import protocol as P
from ..wire.naming import ROSTER_HELLO_PREFIX, TREE_KEY

log = logging.getLogger(__name__)
REGISTERED, UNREGISTERED = P.REGISTERED, P.UNREGISTERED


class RosterSync:
    """Sans-I/O: notifications and rosters in; changes to the client's table
    out, as ``("register" | "unregister", id, uuid)``, and ``("ask",)`` when
    a new roster is needed. Every change is a real one: an engine registered
    twice, or unregistered but never known, changes nothing."""

    def __init__(self, engines: dict):
        self.engines = {int(k): v for k, v in engines.items()}
        self.seq: int | None = None  # the last notification counted in, once a roster came
        self.epoch: str | None = None
        self.asking = False  # a roster is asked for and has not come
        self.rosters = self.gaps = 0

    def ask(self) -> None:
        self.asking = True

    def read(self, msg: dict) -> list[tuple]:
        """The changes a message of the notification socket makes (one the
        hub signed, deserialized); ``ProtocolError`` if it is malformed."""
        kind = msg.get("header", {}).get("msg_type") if isinstance(msg, dict) else None
        try:
            content, md = msg["content"], msg.get("metadata") or {}
            if kind == P.ROSTER:
                engines = content["engines"]
                if not isinstance(engines, dict):
                    raise TypeError(f"engines is a {type(engines).__name__}")
                table = {int(k): str(v) for k, v in engines.items()}
                return self.roster(table, int(content["seq"]), str(content["epoch"]))
            if kind in (REGISTERED, UNREGISTERED, *P.BATCH_NOTIFICATIONS):
                seq = md.get(P.SEQ_KEY)
                seq = None if seq is None else int(seq)
                epoch = md.get(P.EPOCH_KEY)
                if kind in P.BATCH_NOTIFICATIONS:  # one host's engines, one notification
                    each = REGISTERED if kind == P.REGISTRATIONS else UNREGISTERED
                    engines = [(each, int(e), str(u)) for e, u in content["engines"].items()]
                    return self.notification(engines, seq=seq, epoch=epoch)
                return self.notification([(kind, int(content["id"]), str(content["uuid"]))], seq, epoch)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise P.ProtocolError(f"bad {kind!r} notification: {e!r}") from e
        return []

    def roster(self, engines: dict, seq: int, epoch: str) -> list[tuple]:
        """The hub's whole table, as of notification ``seq``."""
        table = {int(k): v for k, v in engines.items()}
        changes = [("unregister", eid, uuid) for eid, uuid in self.engines.items() if table.get(eid) != uuid]
        changes += [("register", eid, uuid) for eid, uuid in table.items() if self.engines.get(eid) != uuid]
        self.engines = table
        self.seq, self.epoch, self.asking = seq, epoch, False
        self.rosters += 1
        return changes

    def notification(self, changes: list[tuple], seq: int | None = None, epoch=None) -> list[tuple]:
        """One notification: its registrations and unregistrations, ``(kind, id, uuid)``;
        ``seq``/``epoch`` its number (None from a stock hub)."""
        extra = []
        if seq is not None and self.seq is not None and not self.asking:
            if epoch == self.epoch and seq <= self.seq:
                return []  # counted in already
            if epoch != self.epoch or seq > self.seq + 1:
                self.gaps += 1
                self.asking = True
                extra = [("ask",)]
            else:
                self.seq = seq
        # applied as they come, counted or not: the roster asked for sets the table right
        return [c for kind, eid, uuid in changes for c in self._apply(kind, int(eid), uuid)] + extra

    def _apply(self, kind: str, eid: int, uuid: str) -> list[tuple]:
        if kind == REGISTERED:
            if self.engines.get(eid) == uuid:
                return []
            old = self.engines.get(eid)
            self.engines[eid] = uuid
            return ([("unregister", eid, old)] if old is not None else []) + [("register", eid, uuid)]
        if kind == UNREGISTERED and eid in self.engines:
            return [("unregister", eid, self.engines.pop(eid))]
        return []


class EngineRoster:
    """A part of our Client: its notification socket read through
    ``RosterSync``, which it owns; ``client`` is the Client it serves (its
    notification socket and handlers, ipyparallel's engine table)."""

    def __init__(self, client):
        self.client = client
        self.ready = threading.Event()  # before the I/O thread can deliver
        self.sync = RosterSync({})
        self.asks = 0

    def wait(self):
        """Once connected, on our controller: the whole engine table, or ``roster_timeout``."""
        timeout = self.client.roster_timeout
        if TREE_KEY in self.client._connection_info and timeout > 0 and not self.ready.wait(timeout):
            log.warning("No engine table from the controller in %.0f s: rc.ids may be short", timeout)

    def open(self):
        """I/O thread, before its loop runs: our handlers, then the hello
        subscription (after ``b""``, so the hub answers once both are live)."""
        client = self.client
        self.sync = RosterSync(dict(client._engine_table))
        handlers = client._notification_table
        for kind in (REGISTERED, UNREGISTERED, P.ROSTER, *P.BATCH_NOTIFICATIONS):
            handlers[kind] = self.on_message
        if TREE_KEY in client._connection_info:
            client._notification_sock.setsockopt(zmq.SUBSCRIBE, P.OURS_TOPIC)  # batches, not stock copies
            self.ask()
        else:  # a stock controller: its notifications, as they come
            self.ready.set()

    def ask(self):
        """A hello topic of our own, the last one let go. (It is kept: a
        controller restarted in place answers it again when the socket reconnects.)"""
        sock, asked = self.client._notification_sock, self.asks
        if asked:
            sock.setsockopt(zmq.UNSUBSCRIBE, self._hello_of(asked))
        self.sync.ask()
        self.asks = asked + 1
        sock.setsockopt(zmq.SUBSCRIBE, self._hello_of(asked + 1))

    def _hello_of(self, ask: int) -> bytes:
        return ROSTER_HELLO_PREFIX + f"{self.client.session.session}:{ask}".encode()

    def on_message(self, msg):
        """I/O thread (a contained handler: a malformed one is logged and dropped)."""
        self.apply(self.sync.read(msg))
        if msg["header"]["msg_type"] == P.ROSTER:
            self.ready.set()

    def apply(self, changes):
        """Each change as ipyparallel files a notification (its callbacks, e.g.
        ``wait_for_engines``, called), or a new roster asked for."""
        run: dict[int, str] = {}  # registrations in a row: filed together
        for change in [*changes, ("end",)]:
            if change[0] == "register":
                run[change[1]] = change[2]
                continue
            if run:
                self._file_registrations(run)
                run = {}
            if change[0] == "ask":
                log.warning("A registration notice was missed: asking the controller for its engines again")
                self.ask()
            elif change[0] == "unregister":
                self.client._file_unregistration(dict(content=dict(id=change[1], uuid=change[2])))

    def _file_registrations(self, engines: dict[int, str]):
        """Engines registered, as ipyparallel files each (its callbacks called
        per engine), in one update of its tables: it sorts its ids at each, and a
        host's batch of thousands, filed one by one, held the client a second."""
        client = self.client
        if len(engines) == 1:
            ((eid, uuid),) = engines.items()
            return client._file_registration(dict(content=dict(id=eid, uuid=uuid)))
        client._file_engines(engines)
        for eid, uuid in engines.items():
            for callback in list(client._registered_callbacks):
                callback(dict(event="register", id=eid, uuid=uuid))
        return None
