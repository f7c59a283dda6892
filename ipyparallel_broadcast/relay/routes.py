"""Where each engine is: the modulo rule, host relays, and route overrides.

By default engine ``e`` is under leaf ``e % n_leaves`` and connects to it
(``topology``). An engine on a host with a *host relay* connects to that relay
instead, and the relay hangs under one leaf. The relay announces its engines
to its leaf (``ipb_host``); the leaf records ``via[e] = relay`` and announces
up the tree (``ipb_route``) the engines it now serves, so every ancestor on
the way overrides its split for those the modulo rule places elsewhere. The
root acknowledges (``ipb_route_ack``) down the announced path, so the relay
learns when its engines can be reached through the whole tree.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from itertools import count

from ..wire import protocol as P
from ..wire.topology import Path, TreeShape
from .events import DOWN, JOINED, UP, Send

DEPARTED_KEPT = 4096  # engines whose routes went, remembered for the requests still on their way
Key = int | bytes  # a child: its digit (a relay node) or its identity (a host relay)


def _remember(table: OrderedDict, keys: Iterable) -> None:
    """Add ``keys`` as the newest; keep the newest ``DEPARTED_KEPT``."""
    for e in keys:
        table[e] = None
        table.move_to_end(e)
    while len(table) > DEPARTED_KEPT:
        table.popitem(last=False)


class Routes:
    """One node's routing: ``split`` targets among its children (and, at a
    leaf, direct engines: key ``None``)."""

    def __init__(self, shape: TreeShape, path: Path, is_leaf: bool):
        self.shape, self.path, self.is_leaf = shape, tuple(path), is_leaf
        self.overrides: dict[int, int] = {}  # interior: eid -> child digit, where not modulo
        self.learned: dict[int, int] = {}  # interior: every engine a child announced
        self.via: dict[int, bytes] = {}  # leaf: eid -> the host relay it is behind
        self.behind: dict[bytes, set[int]] = {}  # leaf: a host relay -> its engines (``via`` by host)
        # engines whose route was removed (they died): a request that was on its
        # way meanwhile fails them as dead, not as sent to the wrong subtree
        self.departed: OrderedDict[int, None] = OrderedDict()
        # uuids of engines the hub unregistered: final (an engine that registers
        # again has a new uuid), so a host relay that lists one (it was cut off
        # meanwhile) gets no route for it
        self.unregistered: OrderedDict[str, None] = OrderedDict()

    def _depart(self, eids: Iterable[int]):
        _remember(self.departed, eids)

    def unregister(self, uuid: str):
        """The hub unregistered the engine ``uuid``: it is never routed again."""
        _remember(self.unregistered, [uuid])

    def count_served(self, engines) -> int:
        """How many of ``engines`` this node serves itself (not through a host relay)."""
        return sum(1 for e in engines if e not in self.via and self.shape.serves(self.path, e))

    def serves(self, eid: int) -> bool:
        """Whether ``eid`` is in this node's subtree, as far as it knows."""
        return eid in self.via or eid in self.learned or self.shape.serves(self.path, eid)

    def split(self, targets: list[int]) -> dict[object, list[int]]:
        """Targets by child key, keeping their order; ``None``: direct engines."""
        if self.is_leaf:
            via = self.via
            if not via:
                return {None: list(targets)}
            groups: dict[object, list[int]] = {}
            for eid in targets:
                groups.setdefault(via.get(eid), []).append(eid)
            return groups
        return self.shape.split(self.path, targets, self.overrides)

    # ---------------------------------------------------------------- updates
    def host_engines(self, host: bytes, eids: Iterable[int]) -> tuple[list[int], list[int]]:
        """A host relay's full engine list: (eids added, eids it no longer has)."""
        eids = set(eids)
        mine = self.behind.setdefault(host, set())
        gone = sorted(mine - eids)  # (this host's engines only: a host's list costs its own engines)
        for e in gone:
            del self.via[e]
        added = sorted(e for e in eids if self.via.get(e) != host)
        for e in added:
            other = self.via.get(e)
            if other is not None:  # it moved to this host relay
                self.behind[other].discard(e)
            self.via[e] = host
            self.departed.pop(e, None)
        self.behind[host] = eids
        self._depart(gone)
        return added, gone

    def host_lost_engine(self, eid: int):
        host = self.via.pop(eid, None)
        if host is not None:
            self.behind[host].discard(eid)
            self._depart([eid])

    def routes_to(self, host: bytes) -> bool:
        """Whether any engine is routed through this host relay."""
        return bool(self.behind.get(host))

    def learn(self, digit: int, add: Iterable[int], remove: Iterable[int]):
        """A child announced engines under it (``add``) or gone (``remove``)."""
        for e in add:
            self.learned[e] = digit
            self.departed.pop(e, None)
            if self.shape.child_digit(self.path, e) == digit:
                self.overrides.pop(e, None)  # the modulo rule already says so
            else:
                self.overrides[e] = digit
        for e in remove:
            if self.learned.get(e) == digit:
                del self.learned[e]
                self._depart([e])
            if self.overrides.get(e) == digit:
                del self.overrides[e]

    def announced(self) -> list[int]:
        """Engines this node would announce to a parent that restarted."""
        return sorted(set(self.via) | set(self.learned))


class Announcements:
    """The messages that keep routes: a host relay's engine list (``ipb_host``),
    announcements up the tree (``ipb_route``), the root's acknowledgement down
    (``ipb_route_ack``), and who waits on it (engines joining a host relay)."""

    def __init__(self, codec, routes: Routes, idents: dict[object, bytes], is_root: bool, host: str | None, boot: str):
        self.codec, self.routes, self.is_root, self.host = codec, routes, is_root, host
        self.idents = idents  # the node's children: key -> identity (host relays come and go)
        self.boot, self._tokens = boot, count()
        self.joining: dict[str, list] = {}  # host relay: announcement token -> who joined

    def host_engines(self, engines: dict[int, str], joining=()) -> list[Send]:
        """Host relay: tell the leaf all of this host's engines."""
        token = f"{self.boot}:{next(self._tokens)}"
        self.joining[token] = list(joining)
        listed = {str(e): u for e, u in engines.items()}
        return [Send(UP, self.codec.pack(P.HOST, dict(host=self.host, engines=listed, token=token)))]

    def from_host(self, key: bytes, content: dict) -> tuple[dict[int, str], list[Send]]:
        """Leaf: a host relay's engine list; route them to it and tell the tree
        (engines the hub unregistered are not routed: the relay is told)."""
        try:
            eids = {int(e): u for e, u in content.get("engines").items() if isinstance(u, str)}
        except (AttributeError, TypeError, ValueError) as e:
            raise P.ProtocolError(f"bad host engine list: {e}") from e
        stale = {e: u for e, u in eids.items() if u in self.routes.unregistered}
        eids = {e: u for e, u in eids.items() if e not in stale}
        _, gone = self.routes.host_engines(key, eids)
        # the relay was cut off while the hub dropped these: it drops them too
        sends = [Send(DOWN, [key] + self.codec.pack(P.LOST, dict(uuid=u, why=P.DIED))) for u in stale.values()]
        return eids, sends + self.up(sorted(eids), gone, key, content.get("token"))

    def up(self, add, remove, host: bytes | None = None, token=None) -> list[Send]:
        """Tell the parent which engines are under this node now (or gone)."""
        content = dict(
            add=add, remove=remove, to=list(self.routes.path), host=host.decode() if host else None, token=token
        )
        if self.is_root:  # nothing above: the route is complete
            return self.ack(content)
        return [Send(UP, self.codec.pack(P.ROUTE, content))]

    def from_child(self, digit: int, content: dict) -> list[Send]:
        add, remove = content.get("add"), content.get("remove")
        if not all(isinstance(x, list) and all(type(e) is int for e in x) for x in (add, remove)):
            raise P.ProtocolError("route announcement without engine id lists")
        self.routes.learn(digit, add, remove)
        if self.is_root:
            return self.ack(content)
        return [Send(UP, self.codec.pack(P.ROUTE, content))]

    def ack(self, content: dict) -> list[Send]:
        """Pass the root's acknowledgement down ``to`` its host relay, which
        answers the engines that joined (``Send(JOINED, [who, ...])``)."""
        to, host, depth, idents = content.get("to"), content.get("host"), len(self.routes.path), self.idents
        if self.host:
            token = content.get("token")
            joined = self.joining.pop(token, []) if isinstance(token, str) else []
            return [Send(JOINED, joined)] if joined else []
        if self.routes.is_leaf:
            ident = host.encode() if isinstance(host, str) else None
            if ident not in idents:
                return []  # an engine gone, or a host relay gone since
            return [Send(DOWN, [ident] + self.codec.pack(P.ROUTE_ACK, content))]
        if not isinstance(to, list) or len(to) <= depth or to[depth] not in idents:
            raise P.ProtocolError(f"route acknowledgement to a bad path {to!r}")
        return [Send(DOWN, [idents[to[depth]]] + self.codec.pack(P.ROUTE_ACK, content))]

    def again(self, engines: dict[int, str]) -> list[Send]:
        """The parent restarted: it hears this node's routes again."""
        return self.host_engines(engines) if self.host else self.up(self.routes.announced(), [])
