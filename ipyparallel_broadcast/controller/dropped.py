"""What our hub does differently about registration, and why.

- **Ids go with their engines.** ipyparallel never drops an id from
  ``hub.ids``, so ``queue_status()`` listed dead engines.
- **A dropped engine that lives is told so.** The hub unregisters an engine
  whose heart missed its beats (a host cut off, a process paused). Its host
  relay tells it (``ipb_dropped``) once the leaf's news arrives, but news
  sent while the host was cut off can be lost with the link, or with a relay
  restarted meanwhile, and the engine then lives on unregistered: it never
  exits, so nothing replaces it. Its heart beats again, and ipyparallel's
  hub ignores that "new heart". Ours answers it with ``ipb_dropped`` on the
  registration socket, which every engine keeps (``BroadcastEngine`` reads
  it). The engine exits, and its launcher or supervisor replaces it.
  An engine registered by its host relay (``hostreg``) is told through
  that relay, which forwards the notice to it.
"""

from __future__ import annotations

from collections import OrderedDict

from ..wire import protocol as P

REMEMBERED = 4096  # hearts of dropped engines kept (the oldest forgotten first)


class DroppedEngines:
    """The engines the hub dropped, told if they beat again (``hubhooks``
    calls ``unregistered`` and ``tell_if_dropped``)."""

    def __init__(self, hub, remembered: int = REMEMBERED):
        self.hub, self.remembered = hub, remembered
        self.dropped: OrderedDict[bytes, int] = OrderedDict()  # heart -> the engine id it had
        self.via: dict[bytes, str] = {}  # heart -> the host whose relay registered it (``hostreg``)
        self.by_host: dict[str, set[bytes]] = {}  # host -> the hearts in ``via`` (a host's, without a scan)
        self.relays: dict[str, list] = {}  # host -> the idents its relay last wrote from

    def unregistered(self, ec) -> None:
        """The hub unregistered this engine: its id goes, and it is remembered."""
        self.hub.ids.discard(ec.id)  # (only this engine's id: a sweep of all ids per engine is O(N²) as hosts leave)
        self._remember(ec.ident, ec.id)

    # ------------------------------------------------ engines registered by host
    def remember_dropped(self, heart: bytes, eid: int, host: str | None):
        """An engine dropped before the hub restarted (its journal says so)."""
        if host is not None:
            self.registered_via(heart, host)
        self._remember(heart, eid)

    def _remember(self, heart: bytes, eid: int):
        """A dropped engine, told if it beats again; the oldest forgotten past ``remembered``."""
        self.dropped[heart] = eid
        while len(self.dropped) > self.remembered:
            self.forget(self.dropped.popitem(last=False)[0])

    def relay_at(self, host: str, idents: list):
        """The relay of ``host`` wrote from ``idents`` (a relay restarted: anew).
        The first word from it since this hub started: the engines of its host
        dropped meanwhile are told now (their notice waited for the route)."""
        first = host not in self.relays
        self.relays[host] = list(idents)
        if first and self.dropped:
            for heart in self.hearts_via(host):
                if heart in self.dropped:
                    self.tell_if_dropped(heart)

    def registered_via(self, heart: bytes, host: str):
        self.forget(heart)
        self.via[heart] = host
        self.by_host.setdefault(host, set()).add(heart)

    def host_of(self, heart: bytes) -> str | None:
        return self.via.get(heart)

    def forget(self, heart: bytes):
        host = self.via.pop(heart, None)
        if host is not None:
            hearts = self.by_host[host]
            hearts.discard(heart)
            if not hearts:
                del self.by_host[host]

    def hearts_via(self, host: str) -> list[bytes]:
        """The hearts registered through the relay of ``host`` (its own, not a scan of all)."""
        return list(self.by_host.get(host, ()))

    def relay_of(self, heart: bytes) -> list | None:
        """The idents of the relay that registered this engine (None: it registered itself)."""
        host = self.via.get(heart)
        return None if host is None else self.relays.get(host)

    def tell_if_dropped(self, heart: bytes) -> bool:
        """If the hub dropped this engine, tell it to exit (True)."""
        if heart not in self.dropped:
            return False
        host = self.via.get(heart)
        if host is not None and host not in self.relays:
            return True  # its relay has not written to this hub yet: told when it does (``relay_at``)
        eid = self.dropped.pop(heart)
        # the heart is the engine's identity on every socket, its registration socket too
        self.hub.log.warning("engine %s was dropped but its heart beats again: telling it to exit", eid)
        relay = self.relay_of(heart)
        if relay is not None:  # its registration socket is its relay's
            self.hub.session.send(self.hub.query, P.DROPPED, dict(uuid=heart.decode()), ident=relay)
        else:
            self.hub.session.send(self.hub.query, P.DROPPED, {}, ident=heart)
        return True
