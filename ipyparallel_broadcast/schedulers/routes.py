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

from typing import Dict, Iterable, List, Tuple, Union

from ..topology import Path, TreeShape

Key = Union[int, bytes]  # a child: its digit (a relay node) or its identity (a host relay)
HOST_PREFIX = b"ipb-host:"


def host_ident(label: str) -> bytes:
    """The zmq identity of a host relay on the link to its leaf."""
    return HOST_PREFIX + label.encode()


class Routes:
    """One node's routing: ``split`` targets among its children (and, at a
    leaf, direct engines: key ``None``)."""

    def __init__(self, shape: TreeShape, path: Path, is_leaf: bool):
        self.shape, self.path, self.is_leaf = shape, tuple(path), is_leaf
        self.overrides: Dict[int, int] = {}  # interior: eid -> child digit, where not modulo
        self.learned: Dict[int, int] = {}  # interior: every engine a child announced
        self.via: Dict[int, bytes] = {}  # leaf: eid -> the host relay it is behind

    def serves(self, eid: int) -> bool:
        """Whether ``eid`` is in this node's subtree, as far as it knows."""
        return eid in self.via or eid in self.learned or self.shape.serves(self.path, eid)

    def split(self, targets: List[int]) -> Dict[object, List[int]]:
        """Targets by child key, keeping their order; ``None``: direct engines."""
        if self.is_leaf:
            via = self.via
            if not via:
                return {None: list(targets)}
            groups: Dict[object, List[int]] = {}
            for eid in targets:
                groups.setdefault(via.get(eid), []).append(eid)
            return groups
        overrides = self.overrides
        if not overrides or not any(e in overrides for e in targets):
            return self.shape.split(self.path, targets)
        out: Dict[object, List[int]] = {}
        for eid in targets:  # rebuilt in target order
            digit = self.overrides.get(eid)
            out.setdefault(self.shape.child_digit(self.path, eid) if digit is None else digit,
                           []).append(eid)
        return out

    # ---------------------------------------------------------------- updates
    def host_engines(self, host: bytes, eids: Iterable[int]) -> Tuple[List[int], List[int]]:
        """A host relay's full engine list: (eids added, eids it no longer has)."""
        eids = set(eids)
        gone = [e for e, h in self.via.items() if h == host and e not in eids]
        for e in gone:
            del self.via[e]
        added = sorted(e for e in eids if self.via.get(e) != host)
        for e in added:
            self.via[e] = host
        return added, gone

    def host_lost_engine(self, eid: int):
        self.via.pop(eid, None)

    def learn(self, digit: int, add: Iterable[int], remove: Iterable[int]):
        """A child announced engines under it (``add``) or gone (``remove``)."""
        for e in add:
            self.learned[e] = digit
            if self.shape.child_digit(self.path, e) == digit:
                self.overrides.pop(e, None)  # the modulo rule already says so
            else:
                self.overrides[e] = digit
        for e in remove:
            if self.learned.get(e) == digit:
                del self.learned[e]
            if self.overrides.get(e) == digit:
                del self.overrides[e]

    def announced(self) -> List[int]:
        """Engines this node would announce to a parent that restarted."""
        return sorted(set(self.via) | set(self.learned))
