"""``Client.outstanding`` and ``View.outstanding`` in one entry per broadcast.

ipyparallel's ``outstanding`` is a set of msg_ids, one per engine per call.
Kept so, a broadcast to 1,024 engines made 1,024 strings, inserted them in
the client's set and the view's, and took them out again one by one as
replies came: a tenth of the client's work per call. An ``OutstandingIds``
holds the same ids, but a broadcast as one entry, its msg_id and the set of
uuids still owed (``engine_vid(msg_id, uuid)`` for each), made into ids only
when read. Every broadcast id splits at its last ``_`` (uuids have none) into
an entry and a member, so a call's own msg_id (``ipb-<session>_<pid>_<n>``) is
a member too, and the set holds exactly what was put in; any other id
(DirectView's) is kept as it is.
It reads and edits as a ``set`` does (the operators, ``update``,
``intersection``, ``difference_update``, ...); what it returns is a plain set.

The I/O thread edits the client's while the user's thread reads it: each
step that reads the entries copies them first (atomic under the GIL).
"""

from __future__ import annotations

from collections.abc import Iterable, MutableSet

from traitlets import TraitType

from ..wire.naming import engine_vid, is_broadcast_id
from .history import CallHistory


def _split(vid) -> tuple:
    """``(msg_id, uuid)`` of a broadcast id with a ``_``; ``(None, None)`` else."""
    if isinstance(vid, str) and is_broadcast_id(vid):
        msg_id, _, uuid = vid.rpartition("_")  # (uuids have no "_")
        if msg_id:
            return msg_id, uuid
    return None, None


class OutstandingIds(MutableSet):
    """A set of msg_ids in which a broadcast's per-engine ids take one entry."""

    __slots__ = ("_plain", "_calls")

    def __init__(self, ids: Iterable = ()):
        self._plain: set = set()  # ids kept as they are
        self._calls: dict[str, set] = {}  # a broadcast's msg_id -> uuids still owed
        self.update(ids)

    # ------------------------------------------------------- a call at once
    def add_call(self, msg_id: str, uuids: Iterable[str]) -> None:
        """A broadcast's per-engine ids, ``engine_vid(msg_id, uuid)`` for each uuid."""
        owed = self._calls.get(msg_id)
        if owed is None:
            self._calls[msg_id] = set(uuids)
        else:
            owed.update(uuids)

    def settle(self, msg_id: str, uuids: Iterable[str]) -> None:
        """These engines' ids of broadcast ``msg_id`` are no longer outstanding."""
        owed = self._calls.get(msg_id)
        if owed is not None:
            owed.difference_update(uuids)
            if not owed:
                self._calls.pop(msg_id, None)

    def drop_call(self, msg_id: str) -> None:
        """Every per-engine id of broadcast ``msg_id`` goes (not its own msg_id)."""
        self._calls.pop(msg_id, None)

    # ------------------------------------------------------------- the set
    def __contains__(self, item) -> bool:
        msg_id, uuid = _split(item)
        if msg_id is None:
            return item in self._plain
        owed = self._calls.get(msg_id)
        return owed is not None and uuid in owed

    def __iter__(self):
        yield from list(self._plain)
        for msg_id, owed in list(self._calls.items()):
            prefix = engine_vid(msg_id, "")
            yield from [prefix + uuid for uuid in list(owed)]

    def __len__(self) -> int:
        return len(self._plain) + sum(len(owed) for owed in list(self._calls.values()))

    def __bool__(self) -> bool:
        return bool(self._plain) or any(list(self._calls.values()))

    def add(self, item) -> None:
        msg_id, uuid = _split(item)
        if msg_id is None:
            self._plain.add(item)
        else:
            self.add_call(msg_id, (uuid,))

    def discard(self, item) -> None:
        msg_id, uuid = _split(item)
        if msg_id is None:
            self._plain.discard(item)
        else:
            self.settle(msg_id, (uuid,))

    def clear(self) -> None:
        self._plain.clear()
        self._calls.clear()

    def copy(self) -> set:
        return set(self)

    def update(self, *others) -> None:
        for ids in others:
            if isinstance(ids, CallHistory):  # (a view's save_ids: a call's ids as one entry)
                for item in ids.entries():
                    self.add(item) if isinstance(item, str) else self.add_call(*item)
            elif isinstance(ids, OutstandingIds):
                self._plain.update(ids._plain)
                for msg_id, owed in list(ids._calls.items()):
                    self.add_call(msg_id, list(owed))
            else:
                for item in list(ids):
                    self.add(item)

    def difference_update(self, *others) -> None:
        for ids in others:
            for item in list(ids):
                self.discard(item)

    def intersection_update(self, *others) -> None:
        """Keep what every one of ``others`` holds: per entry when another is
        an ``OutstandingIds`` (a view settling against its client's)."""
        for other in others:
            if not isinstance(other, OutstandingIds):
                other = set(other)
                self._plain = {i for i in self._plain if i in other}
                for msg_id, owed in list(self._calls.items()):
                    prefix = engine_vid(msg_id, "")
                    self._keep(msg_id, {u for u in owed if prefix + u in other})
                continue
            self._plain.intersection_update(other._plain)
            for msg_id, owed in list(self._calls.items()):
                theirs = other._calls.get(msg_id)
                self._keep(msg_id, owed.intersection(theirs) if theirs is not None else set())

    def _keep(self, msg_id: str, owed: set) -> None:
        if owed:
            self._calls[msg_id] = owed
        else:
            self._calls.pop(msg_id, None)

    def union(self, *others) -> set:
        return set(self).union(*others)

    def intersection(self, *others) -> set:
        out = set(self)
        return out.intersection(*others)

    def difference(self, *others) -> set:
        return set(self).difference(*others)

    def symmetric_difference(self, other) -> set:
        return set(self).symmetric_difference(other)

    def issubset(self, other) -> bool:
        return set(self).issubset(other)

    def issuperset(self, other) -> bool:
        return all(item in self for item in other)

    def __eq__(self, other) -> bool:
        if isinstance(other, (set, frozenset, OutstandingIds)):
            return set(self) == set(other)
        return NotImplemented

    __hash__ = None  # (mutable, as a set)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({set(self)!r})"

    @classmethod
    def _from_iterable(cls, it):
        return set(it)  # (the operators give plain sets, as ``set``'s do)


class Outstanding(TraitType):
    """An ``OutstandingIds`` trait; a set assigned to it becomes one."""

    info_text = "a set of msg_ids"

    def make_dynamic_default(self):
        return OutstandingIds()

    def validate(self, obj, value):
        if isinstance(value, OutstandingIds):
            return value
        if isinstance(value, (set, frozenset, list, tuple)):
            return OutstandingIds(value)
        self.error(obj, value)
