"""Every hook into ipyparallel's hub, installed once, here.

ipyparallel's ``Hub`` dispatches its sockets' messages to its own methods and
handler tables. Where the controller's parts change what one does, that
method is replaced by ``HubHooks.install``, once, with a function that asks
the parts in the order below; no part replaces a hub method itself, and the
hub's own tables (``engines``, ``incoming_registrations``) stay its plain
dicts: what changes them is told to the engine journal as an event
(``EngineLedger``) by the hook that made the change.

=============================  ==================================================
hub method                     what runs, in order
=============================  ==================================================
``new_engine_id``              the placement: a least-loaded leaf (an id asked for is kept)
``handle_new_heart``           the restoration hears it (``restore``); a host relay's
                               heart tells its host's dropped engines (``hostreg``);
                               a dropped engine's is told to exit (``dropped``);
                               else the hub's (it finishes a registration)
``handle_stopped_heart``       a host relay's: its host's engines unregistered
                               (``hostreg``); else the hub's
``register_engine``            the hub's; the grant journaled
``finish_registration``        the hub's; the engine journaled
``_purge_stalled_registration`` the hub's; the grant journaled gone
``unregister_engine``          records filed first; the hub's; the id forgotten and
                               the engine remembered as dropped (``dropped``), journaled
``connection_request``         the roster notes the reply (``roster``); the hub's
``query_handlers``             ``ipb_host_engines`` to ``hostreg``; a resubmit of a
                               stripped record refused (``records``); every handler
                               files the records first
``monitor_handlers``           the broadcast copies to ``records``' journal
``monitor.on_recv``            the copies read without copying their buffers (a
                               root's bundle carries every engine's result);
                               other topics as bytes, to the hub's dispatch
``save_iopub_message``         a broadcast's output filed per engine (``records``)
``_save_engine_state``         the journal synced once per burst (``restore``)
``notifier``                   the roster's door (an XPUB, ``roster``)
=============================  ==================================================
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps

from ..compat import ipp
from ..wire import protocol as P
from .dropped import DroppedEngines
from .enginejournal import EngineLedger
from .hostreg import HostRegistrations
from .records import BroadcastRecords
from .restore import KeptEngines
from .roster import RosterDoor


@dataclass
class HubParts:
    """What the hub's hooks call: each part owns its state."""

    place: Callable[[int | None], int | None]  # an id for a new engine (None: the hub's counter)
    dropped: DroppedEngines
    hosts: HostRegistrations
    kept: KeptEngines
    door: RosterDoor
    records: BroadcastRecords | None = None


class HubHooks:
    """Installs the table above on ``hub``, once."""

    # the hub's methods replaced by this class's of the same name
    METHODS = (
        "new_engine_id",
        "handle_new_heart",
        "handle_stopped_heart",
        "register_engine",
        "finish_registration",
        "unregister_engine",
        "connection_request",
        "save_iopub_message",
    )

    def __init__(self, hub, parts: HubParts):
        self.hub, self.parts = hub, parts
        self.stock: dict[str, Callable] = {}  # the hub's own methods, as it had them
        self.installed = False

    @property
    def ledger(self) -> EngineLedger:
        return self.parts.kept.ledger

    def install(self) -> None:
        if self.installed:
            raise RuntimeError("the hub's hooks are installed once")
        self.installed = True
        hub, parts = self.hub, self.parts
        for name in self.METHODS:
            self.stock[name] = getattr(hub, name)
            setattr(hub, name, getattr(self, name))
        ipp.wrap_hub_purge(hub, self._purge_stalled_registration)
        ipp.coalesce_hub_state_file(hub, lambda _whole_table: parts.kept.syncs.changed)
        stock_notifier, hub.notifier = hub.notifier, parts.door
        stock_notifier.close(linger=0)
        self._query_handlers()
        if parts.records is not None:
            copies = parts.records.copy_handlers()
            hub.monitor_handlers.update(copies)
            hub.monitor.on_recv(self._monitor_reader(copies), copy=False)

    def _query_handlers(self) -> None:
        hub, records = self.hub, self.parts.records
        handlers = hub.query_handlers
        handlers[P.HOST_ENGINES] = self.parts.hosts.on_batch
        handlers["unregistration_request"] = self.unregister_engine
        handlers["connection_request"] = self.connection_request
        if records is not None and "resubmit_request" in handlers:
            handlers["resubmit_request"] = self._whole_only(handlers["resubmit_request"])
        if records is not None:  # file first: then they read (an unregistration files itself)
            for name, handler in list(handlers.items()):
                if name != "unregistration_request":
                    handlers[name] = self._filing_first(handler)

    # ------------------------------------------------------------ engine ids
    def new_engine_id(self, requested_id=None) -> int:
        return self.stock["new_engine_id"](self.parts.place(requested_id))

    # -------------------------------------------------------------- hearts
    def handle_new_heart(self, heart: bytes):
        parts = self.parts
        if parts.kept.restoration is not None:
            parts.kept.restoration.heard(heart)
        if parts.hosts.relay_heart_beats(heart) or parts.dropped.tell_if_dropped(heart):
            return None
        return self.stock["handle_new_heart"](heart)

    def handle_stopped_heart(self, heart: bytes):
        if self.parts.hosts.relay_heart_stopped(heart):
            return None
        return self.stock["handle_stopped_heart"](heart)

    # -------------------------------------------------------- registration
    def register_engine(self, reg, msg):
        eid = self.stock["register_engine"](reg, msg)
        try:
            heart = msg["content"]["uuid"].encode("utf8")
        except (KeyError, TypeError, AttributeError):
            return eid
        ec = self.hub.incoming_registrations.get(heart)
        if ec is not None and ec.id == eid:
            self.ledger.granted(ec)
        return eid

    def finish_registration(self, heart: bytes):
        pending = self.hub.incoming_registrations.get(heart)
        self.stock["finish_registration"](heart)
        if pending is not None and self.hub.engines.get(pending.id) is pending:
            self.ledger.filed(pending)

    def _purge_stalled_registration(self, purge: Callable[[bytes], None]) -> Callable[[bytes], None]:
        def purged(heart: bytes):
            pending = self.hub.incoming_registrations.get(heart)
            purge(heart)
            if pending is not None and heart not in self.hub.incoming_registrations:
                self.ledger.withdrawn(pending)

        return purged

    def unregister_engine(self, ident, msg):
        hub = self.hub
        if self.parts.records is not None:
            self.parts.records.file_all()  # what is filed of this engine, before it goes
        try:
            eid = msg["content"]["id"]
            ec = hub.engines.get(eid)
            grants = [g for g in hub.incoming_registrations.values() if g.id == eid] if ec is None else []
        except (KeyError, TypeError):
            ec, grants = None, []  # ipyparallel's handler logs the bad request
        self.stock["unregister_engine"](ident, msg)
        if ec is not None and ec.id not in hub.engines:
            stopped = hub.expect_stopped_hearts  # (the hub's list, scanned per stopped heart)
            if self.parts.dropped.host_of(ec.ident) is not None and stopped and stopped[-1] == ec.ident:
                stopped.pop()  # its relay's heart stands for it: no heart of its own will stop
            self.ledger.dropped(ec)
            self.parts.dropped.unregistered(ec)
        for grant in grants:
            if hub.incoming_registrations.get(grant.ident) is not grant:
                self.ledger.withdrawn(grant)

    # ------------------------------------------------------------- clients
    def connection_request(self, client_id, msg):
        """A leaf's lookup (``TABLE_ONLY``) is not followed by a subscription:
        the roster does not wait for one (see ``roster.UnmatchedReplies``)."""
        content = msg.get("content")
        if not (isinstance(content, dict) and content.get(P.TABLE_ONLY)):
            self.parts.door.roster.replied()
        return self.stock["connection_request"](client_id, msg)

    # ------------------------------------------------------------- records
    def save_iopub_message(self, topics, msg):
        records = self.parts.records
        stock = self.stock["save_iopub_message"]
        if records is not None and records.takes_iopub(msg):
            return records.save_iopub(topics, msg, stock)
        return stock(topics, msg)

    def _monitor_reader(self, copies: dict) -> Callable[[list], None]:
        """The monitor's messages as zmq frames: a copy of ours keeps its
        buffers (a coalesced call's results, a megabyte at 1,024 engines) as
        zmq received them, where ipyparallel's reader copies each into bytes;
        any other topic goes to the hub's dispatch as bytes, as it expects."""
        hub, log = self.hub, self.hub.log

        def read(frames: list):
            try:
                topic = frames[0].bytes
                handler = copies.get(topic)
                if handler is None:
                    return hub.dispatch_monitor_traffic([f.bytes for f in frames])
                idents, msg = hub.session.feed_identities(frames[1:], copy=False)
                # the signature and the four dicts as bytes (Session.deserialize reads them so)
                handler(idents, [f.bytes for f in msg[:5]] + msg[5:])
            except Exception:  # (a bad copy must not stop the monitor's stream)
                log.error("broadcast:: dropped a monitor message", exc_info=True)

        return read

    def _filing_first(self, handler):
        records = self.parts.records

        @wraps(handler)
        def filed_then(*args, **kwargs):
            records.file_all()
            return handler(*args, **kwargs)

        return filed_then

    def _whole_only(self, resubmit):
        records = self.parts.records

        @wraps(resubmit)
        def checked(client_id, msg):
            if not records.refused_resubmit(client_id, msg):
                return resubmit(client_id, msg)
            return None

        return checked
