"""A restarted controller takes its engines back, with their ids.

Started with ``--restore`` (as its launcher restarts it, see
``launch.keepsettings``), the controller reads its engine journal
(``enginejournal``) and files every engine there as registered: the same id
and uuid, through the same host relay. Engines and host relays wait for it
(ZeroMQ reconnects them to the same ports), so nothing re-registers and
every namespace is as it was.

An engine that died while the controller was away must still be found
dead. The restarted heart monitor knows no heart, so each heart that beats
is new to it: a restored engine's own (one on the controller's host), or
its host relay's, which stands for its host's engines. Those that have
not beaten within ``grace`` seconds are unregistered, named, as a heart
that stopped is. An id granted to an engine whose heart had not beaten yet
is pending again: the engine is filed when it beats, as it would have been.
"""

from __future__ import annotations

import atexit
from collections.abc import Callable

from ipyparallel.controller.hub import EngineConnector

from ..compat import ipp
from .enginejournal import EngineJournal, EngineLedger, JournalState
from .hostreg import HostEngine
from .statefile import CoalescedWrites


class KeptEngines:
    """The hub's engines, kept for a restart: its journal (synced once per
    burst, in place of ipyparallel's whole-table file, see ``hubhooks``),
    read back and filed again when restoring."""

    def __init__(self, hub, registry, path: str, loads=None):
        self.hub, self.registry = hub, registry
        self.journal = EngineJournal(path)
        self.syncs = CoalescedWrites(self.journal.sync, hub.loop.call_later)
        self.ledger = EngineLedger(self.journal, registry.host_of, self.syncs.changed, loads)
        self.restoration: Restoration | None = None

    def open(self, restore: bool, grace: float, hosts) -> None:
        """The journal read (``restore``: its engines filed again, through ``hosts``) or emptied."""
        hub = self.hub
        state = self.journal.restore(keep=restore)
        atexit.register(self.syncs.flush)
        if restore:
            self.restoration = Restoration(hub, self.registry, hosts, self.ledger, hub.loop.call_later)
            self.restoration.restore(state, grace)

    def close(self) -> None:
        """An orderly stop: the journal goes (its engines stop too)."""
        self.syncs.flush()
        self.journal.close(remove=True)


class Restoration:
    """Files a journal's engines into ``hub`` and watches that they beat."""

    def __init__(
        self,
        hub,
        registry,
        host_registrations,
        ledger: EngineLedger,
        later: Callable[[float, Callable[[], None]], object],
    ):
        self.hub, self.registry, self.hosts, self.later = hub, registry, host_registrations, later
        self.ledger = ledger
        self.waiting: dict[bytes, list[bytes]] = {}  # a heart not yet beating -> the engines it stands for
        self.grants: list[bytes] = []  # engines on the controller's host granted an id, not yet beating
        self.restored = self.granted = self.lost = 0

    def restore(self, state: JournalState, grace: float) -> None:
        hub, hosts = self.hub, self.hosts
        for eid, (uuid, host) in sorted(state.engines.items()):
            heart = uuid.encode()
            ec = EngineConnector(id=eid, uuid=uuid, ident=heart) if host is None else HostEngine(eid, uuid, heart)
            if host is not None:
                relay_heart = self._via(heart, host)
            else:
                hub.hearts[heart] = eid  # its own heart stands for it
                relay_heart = heart
            hosts.file(ec)
            self.waiting.setdefault(relay_heart, []).append(heart)
        self.restored = len(state.engines)
        self._grants(state, grace)
        for eid, (uuid, host) in state.dropped.items():  # told, if they live, as the hub that dropped them would
            self.registry.remember_dropped(uuid.encode(), eid, host)
        ipp.set_hub_next_id(hub, max(state.top + 1, ipp.hub_next_id(hub)))
        if self.waiting or self.grants:
            self.later(grace, self.give_up)
        hub.log.info(
            "restored %i engines and %i grants (ids up to %i) through %i hearts; "
            "those silent for %g s will be unregistered",
            self.restored,
            self.granted,
            state.top,
            len(self.waiting),
            grace,
        )

    def _via(self, heart: bytes, host: str) -> bytes:
        """An engine registered by the relay of ``host``: that relay's heart."""
        self.registry.registered_via(heart, host)
        return self.hosts.relay_of_host(host)

    def _grants(self, state: JournalState, grace: float) -> None:
        """Ids granted to engines whose heart had not beaten: pending again,
        filed when it beats (its relay says so, or the heart monitor), set
        aside as ever if it does not."""
        through_hosts = []
        for eid, (uuid, host) in sorted(state.granted.items()):
            heart = uuid.encode()
            if host is not None:
                ec = HostEngine(eid, uuid, heart)
                self.hosts.relay_of_host(host)
                through_hosts.append((ec, host))
            else:
                ec = EngineConnector(id=eid, uuid=uuid, ident=heart)
                self.hub.incoming_registrations[heart] = ec
                self.grants.append(heart)
        self.hosts.granted_before(through_hosts)
        self.granted = len(state.granted)

    def heard(self, heart: bytes) -> None:
        """A heart beats (``hubhooks``): what it stands for is back."""
        self.waiting.pop(heart, None)

    def give_up(self):
        """The restored engines whose heart (or host relay's) never beat: unregistered."""
        hub = self.hub
        for heart, engines in list(self.waiting.items()):
            lost = [h for h in engines if h in hub.by_ident]
            hub.log.warning(
                "restored engines %s did not come back (no heartbeat from %r): unregistered",
                [hub.by_ident[h] for h in lost],
                heart,
            )
            self.hosts.unregister(lost)
            self.lost += len(lost)
        self.waiting.clear()
        for heart in self.grants:  # (ipyparallel purges a stalled registration so)
            ec = self.hub.incoming_registrations.pop(heart, None)
            if ec is not None:
                self.ledger.withdrawn(ec)
