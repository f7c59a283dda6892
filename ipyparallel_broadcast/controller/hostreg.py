"""The hub's side of registration by host (the relay's: ``relay.registrar``).

A host relay sends ``ipb_host_engines``: the engines of its host that ask to
register, and those gone. The hub grants every id in one step, files each
engine as ipyparallel's ``finish_registration`` does, answers in one message,
publishes one notification (``Roster.registrations``) and writes its state
file once. ipyparallel registers each engine in a request, a heart handshake,
a notification and a state-file write, and scans its pending registrations
for each: a burst of N engines cost the center O(N²).

Heartbeats go by host too: the hub's heart monitor pings the relays, and
each relay watches its own engines' hearts (``relay.enginehearts``). An
engine is filed, and told to clients, once its relay says its heart beats,
as ipyparallel files one at its first beat: by then it has joined its relay
and connected its sockets, so a call sent at once reaches it. The engines a
batch says beat are filed together and told in one notification. (The
pending engines are kept here, not in the hub's ``incoming_registrations``,
which ipyparallel scans per registration.) One that has not beaten by the
hub's ``registration_timeout`` is set aside; if its relay says later that it
beats after all (a host too loaded to join it and start its heart in time:
10,000 simulated engines on 2 cores left 2 or 3 so), it is filed then. A relay whose heart
stops takes its host's engines with it, unregistered by name.
A second batch naming an engine registered through the same host is
answered with the same id: a relay that sends a batch again (its answer
late, the hub restarting) registers nothing twice. Ids are ipyparallel's
own, from its counter, in the order the hub grants them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

from ..compat import ipp
from ..wire import protocol as P
from ..wire.topology import host_ident
from .enginejournal import EngineLedger


class HostEngine:
    """An engine registered by host, as the hub's table holds it: what
    ipyparallel's ``EngineConnector`` has, without its traitlets (whose
    validation and notification were a third of the hub's CPU per engine
    registered), for the hub reads only these attributes."""

    __slots__ = ("id", "uuid", "ident", "pending", "stallback", "registration_started")

    def __init__(self, id: int, uuid: str, ident: bytes):  # noqa: A002 (the hub's name for it)
        self.id, self.uuid, self.ident = id, uuid, ident
        self.pending: set = set()
        self.stallback = None
        self.registration_started = 0.0


class HostRegistrations:
    """Handles ``ipb_host_engines`` on the hub's registration socket."""

    def __init__(
        self,
        hub,
        publish: Callable[[dict[int, str]], None],
        registry,
        ledger: EngineLedger,
        held: Callable[[], AbstractContextManager] = nullcontext,
    ):
        self.hub, self.publish, self.registry, self.ledger = hub, publish, registry, ledger
        self.held = held  # the hub's unregistrations inside told as one batch (``RosterDoor.held``)
        self.pending: dict[bytes, HostEngine] = {}  # heart -> an engine granted its id, not beating yet
        # heart -> (engine, host) of those that had not beaten by ``registration_timeout`` (the latest kept)
        self.late: OrderedDict[bytes, tuple[HostEngine, str]] = OrderedDict()
        self.host_hearts: dict[bytes, str] = {}  # a relay's heart -> its host
        self.batches = self.registered = 0

    def on_batch(self, idents, msg):
        content = msg["content"]
        host, asks = content.get("host"), content.get("engines")
        gone, beating = content.get("gone") or [], content.get("beating") or []
        if not isinstance(host, str) or not all(isinstance(x, list) for x in (asks, gone, beating)):
            self.hub.log.error("registration by host: a malformed batch dropped: %.200r", content)
            return
        self.registry.relay_at(host, idents)  # where a dropped engine of it is told so
        self.host_hearts[host_ident(host)] = host
        self.batches += 1
        with self.ledger.batch(commit=True):  # on disk before the relay hears of it
            self._depart(host, [u for u in gone if isinstance(u, str)])
            self._beat(host, [u for u in beating if isinstance(u, str)])
            answers, new = self._grant(host, asks)
        hub = self.hub
        reply = dict(engines=answers, hb_period=hub.heartmonitor_period, connection_info=hub.engine_info)
        hub.session.send(hub.query, P.HOST_ENGINES_REPLY, content=reply, parent=msg, ident=idents)
        if new:
            hub.log.info("registration::host %s: ids %s granted to %i engines", host, _span(new), len(new))
            self.purge_later([u.encode() for u in new.values()])

    # --------------------------------------------------- a restarted hub's
    def pending_ids(self) -> list[int]:
        """The ids granted here to engines not beating yet."""
        return [ec.id for ec in self.pending.values()]

    def relay_of_host(self, host: str) -> bytes:
        """An engine of ``host`` restored (``restore``): its relay's heart, which stands for it."""
        heart = host_ident(host)
        self.host_hearts[heart] = host
        return heart

    def granted_before(self, grants: list[tuple[HostEngine, str]]):
        """Engines granted their ids before the hub restarted: pending again."""
        for ec, host in grants:
            self.registry.registered_via(ec.ident, host)
            self.pending[ec.ident] = ec
        if grants:
            self.purge_later([ec.ident for ec, _ in grants])

    def purge_later(self, hearts: list[bytes]):
        """Those of these engines not beating by ``registration_timeout`` are set aside."""
        self.hub.loop.call_later(self.hub.registration_timeout, self._purge, hearts)

    def _beat(self, host: str, uuids: list[str]):
        """Engines whose heart beats, as their relay says: filed, and told in one notification."""
        filed = {}
        for uuid in uuids:
            heart = uuid.encode()
            ec = self.pending.get(heart)
            if ec is None and heart in self.late and self.late[heart][1] == host:  # it beats after all
                self.registry.registered_via(heart, host)
                ec = self.pending[heart] = self.late.pop(heart)[0]  # (filed next: journaled so)
                self.hub.log.warning("registration::engine %i:%s beats at last; registered", ec.id, ec.uuid)
            if ec is not None and self.registry.host_of(heart) == host:
                del self.pending[heart]
                self.file(ec)
                self.ledger.filed(ec)
                filed[ec.id] = ec.uuid
            elif heart not in self.hub.by_ident:
                self.registry.tell_if_dropped(heart)  # dropped, and beating again: told to exit
        if filed:
            self.registered += len(filed)
            self.hub.log.info("registration::host %s: %i engines registered (%s)", host, len(filed), _span(filed))
            self.publish(filed)
            ipp.save_hub_state(self.hub)

    def relay_heart_beats(self, heart: bytes) -> bool:
        """A relay's heart beats (again): the engines of its host the hub
        dropped while it was silent are told so, through it, and exit.
        False: not a relay's heart."""
        host = self.host_hearts.get(heart)
        if host is None:
            return False
        registry = self.registry
        for h in registry.hearts_via(host):
            if h in registry.dropped:
                registry.tell_if_dropped(h)
        return True

    def relay_heart_stopped(self, heart: bytes) -> bool:
        """A relay's heart stopped: its host's engines are lost, named.
        False: not a relay's heart."""
        host = self.host_hearts.get(heart)
        if host is None:
            return False
        hub = self.hub
        lost = [h for h in self.registry.hearts_via(host) if h in hub.by_ident]
        if lost:
            hub.log.warning("heartbeat::the relay of host %s is silent: its %i engines are lost", host, len(lost))
        self.unregister(lost)
        return True

    def unregister(self, hearts: list[bytes]):
        """These engines unregistered, as ipyparallel unregisters one, told
        and journaled as one batch."""
        hub = self.hub
        with self.ledger.batch(), self.held():
            for h in hearts:
                if h in hub.by_ident:
                    hub.unregister_engine([h], dict(content=dict(id=hub.by_ident[h])))

    def _purge(self, hearts):
        for heart in hearts:
            ec = self.pending.pop(heart, None)
            if ec is not None:
                self.ledger.withdrawn(ec)
                host = self.registry.host_of(heart)
                self.hub.log.error(
                    "registration::engine %i:%s has not beaten in %g s; set aside",
                    ec.id,
                    ec.uuid,
                    self.hub.registration_timeout,
                )
                self.registry.forget(heart)
                self.late[heart] = (ec, host)
                while len(self.late) > self.registry.remembered:
                    self.late.popitem(last=False)

    def _grant(self, host: str, asks: list) -> tuple[list[dict], dict[int, str]]:
        hub, registry = self.hub, self.registry
        stock_pending = {ec.uuid for ec in hub.incoming_registrations.values()}
        pending_ids = None  # (made once a batch, if an engine asks for an id)
        answers, new = [], {}
        for ask in asks:
            uuid = ask.get("uuid") if isinstance(ask, dict) else None
            if not isinstance(uuid, str) or not uuid:
                continue
            heart = uuid.encode()
            eid = hub.by_ident.get(heart, self.pending[heart].id if heart in self.pending else None)
            if eid is not None and registry.host_of(heart) == host:  # asked again: the same answer
                answers.append(dict(uuid=uuid, status="ok", id=eid))
                continue
            if eid is not None or uuid in stock_pending:
                answers.append(dict(uuid=uuid, status="error", ename="KeyError", evalue=f"uuid {uuid!r} in use"))
                continue
            asked = ask.get("id")
            if type(asked) is int and pending_ids is None:
                pending_ids = set(self.pending_ids())
            if type(asked) is not int or asked in pending_ids:
                asked = None
            eid = type(hub).new_engine_id(hub, asked)  # ipyparallel's counter (or the id asked for, if free)
            self.late.pop(heart, None)  # (set aside, and asking again: this id, not that one)
            registry.registered_via(heart, host)  # (first: the grant is journaled with its host)
            ec = self.pending[heart] = HostEngine(eid, uuid, heart)
            if pending_ids is not None:
                pending_ids.add(eid)
            self.ledger.granted(ec)
            new[eid] = uuid
            answers.append(dict(uuid=uuid, status="ok", id=eid))
        return answers, new

    def file(self, ec):
        """The engine registered, as ``Hub.finish_registration`` files it
        (its notification, state-file write and journal line are the caller's)."""
        hub, eid = self.hub, ec.id
        hub.ids.add(eid)
        hub.engines[eid] = ec
        hub.by_ident[ec.ident] = eid
        hub.queues[eid] = []
        hub.tasks[eid] = []
        hub.completed[eid] = []  # (no heart: its relay's stands for it)

    def _depart(self, host: str, uuids: list[str]):
        """Engines the relay found gone: unregistered as ipyparallel unregisters one."""
        hub, leaving = self.hub, []
        for uuid in uuids:
            heart = uuid.encode()
            if self.late.get(heart, (None, None))[1] == host:
                del self.late[heart]  # set aside, and now gone
            if self.registry.host_of(heart) != host:
                continue  # not this relay's
            ec = self.pending.pop(heart, None)
            if ec is not None:
                self.ledger.withdrawn(ec)
                continue  # gone before its first beat
            eid = hub.by_ident.get(heart)
            if eid is not None:
                hub.log.info("registration::host %s: engine %i is gone", host, eid)
                leaving.append(heart)
        self.unregister(leaving)


def _span(eids) -> str:
    eids = sorted(eids)
    return f"{eids[0]}" if len(eids) == 1 else f"{eids[0]}..{eids[-1]}"
