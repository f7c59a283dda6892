"""The hub's side of registration by host (the relay's: ``relay.registrar``).

A host relay sends ``ipb_host_engines``: the engines of its host that ask to
register, and those gone. The hub grants every id in one step, files each
engine as ipyparallel's ``finish_registration`` does, answers in one message,
publishes one notification (``Roster.registrations``) and writes its state
file once. ipyparallel registers each engine in a request, a heart handshake,
a notification and a state-file write, and scans its pending registrations
for each: a burst of N engines cost the center O(N²).

The relay vouches for its engines (each asked it on a local socket, from a
process it watches), so a batch is finished at once, without waiting for
each engine's first heartbeat. A second batch naming an engine registered
through the same host is answered with the same id: a relay that sends a
batch again (its answer late, the hub restarting) registers nothing twice.
Ids are ipyparallel's own, from its counter, in the order the hub grants them.
"""

from __future__ import annotations

from collections.abc import Callable

from ipyparallel.controller.hub import EngineConnector

from ..compat import ipp
from ..wire import protocol as P


class HostRegistrations:
    """Handles ``ipb_host_engines`` on the hub's registration socket."""

    def __init__(self, hub, publish: Callable[[dict[int, str]], None], registry):
        self.hub, self.publish, self.registry = hub, publish, registry
        self.relays: dict[str, list] = {}  # host label -> the idents its relay last wrote from
        self.batches = self.registered = 0
        hub.query_handlers[P.HOST_ENGINES] = self.on_batch
        registry.relay_of = self.relay_of  # a dropped engine is told through its relay

    def on_batch(self, idents, msg):
        content = msg["content"]
        host, asks, gone = content.get("host"), content.get("engines"), content.get("gone") or []
        if not isinstance(host, str) or not isinstance(asks, list) or not isinstance(gone, list):
            self.hub.log.error("registration by host: a malformed batch dropped: %.200r", content)
            return
        self.relays[host] = list(idents)
        self.batches += 1
        self._depart(host, [u for u in gone if isinstance(u, str)])
        answers, new = self._grant(host, asks)
        hub = self.hub
        reply = dict(engines=answers, hb_period=hub.heartmonitor_period, connection_info=hub.engine_info)
        hub.session.send(hub.query, P.HOST_ENGINES_REPLY, content=reply, parent=msg, ident=idents)
        if new:
            self.registered += len(new)
            hub.log.info("registration::host %s: %i engines registered (%s)", host, len(new), _span(new))
            self.publish(new)
            ipp.save_hub_state(hub)

    def _grant(self, host: str, asks: list) -> tuple[list[dict], dict[int, str]]:
        hub, via = self.hub, self.registry.via
        pending = {ec.uuid for ec in hub.incoming_registrations.values()}
        answers, new = [], {}
        for ask in asks:
            uuid = ask.get("uuid") if isinstance(ask, dict) else None
            if not isinstance(uuid, str) or not uuid:
                continue
            heart = uuid.encode()
            eid = hub.by_ident.get(heart)
            if eid is not None and via.get(heart) == host:  # asked again: the same answer
                answers.append(dict(uuid=uuid, status="ok", id=eid))
                continue
            if eid is not None or uuid in pending or uuid in new.values():
                answers.append(dict(uuid=uuid, status="error", ename="KeyError", evalue=f"uuid {uuid!r} in use"))
                continue
            asked = ask.get("id")
            eid = type(hub).new_engine_id(hub, asked if type(asked) is int else None)  # ipyparallel's counter
            self._file(EngineConnector(id=eid, uuid=uuid, ident=heart))
            via[heart] = host
            new[eid] = uuid
            answers.append(dict(uuid=uuid, status="ok", id=eid))
        return answers, new

    def _file(self, ec):
        """The engine registered, as ``Hub.finish_registration`` files it
        (its notification and state-file write are the batch's)."""
        hub, eid = self.hub, ec.id
        hub.ids.add(eid)
        hub.engines[eid] = ec
        hub.by_ident[ec.ident] = eid
        hub.queues[eid] = []
        hub.tasks[eid] = []
        hub.completed[eid] = []
        hub.hearts[ec.ident] = eid

    def _depart(self, host: str, uuids: list[str]):
        """Engines the relay found gone: unregistered as ipyparallel unregisters one."""
        hub, via = self.hub, self.registry.via
        for uuid in uuids:
            heart = uuid.encode()
            eid = hub.by_ident.get(heart)
            if eid is not None and via.get(heart) == host:
                hub.log.info("registration::host %s: engine %i is gone", host, eid)
                hub.unregister_engine([heart], dict(content=dict(id=eid)))

    def relay_of(self, heart: bytes) -> list | None:
        """The idents of the relay that registered this engine (None: it registered itself)."""
        host = self.registry.via.get(heart)
        return None if host is None else self.relays.get(host)


def _span(eids) -> str:
    eids = sorted(eids)
    return f"{eids[0]}" if len(eids) == 1 else f"{eids[0]}..{eids[-1]}"
