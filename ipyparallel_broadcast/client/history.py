"""``Client.history`` and ``View.history`` in one entry per broadcast.

ipyparallel's history lists one msg_id per engine per call, and the hub's
records agree (``hub_history``, ``db_query``). Kept as strings, that is
~130 bytes per engine per call: 1.3 MB per 10,000 calls at 1,000 engines,
never freed. A ``CallHistory`` reads the same ids, in the same order, but
keeps a broadcast as one ``(msg_id, uuids)`` entry and makes its engines'
ids when they are read. Plain msg_ids (DirectView's, a reduction's) are kept
as they are.

A history with a ``limit`` keeps at most that many entries (a broadcast is
one entry, a DirectView call one per engine) and forgets the oldest first, so
a client that makes calls for days does not grow without end
(``Client.history_limit``). Indices stay where they were: ``len()`` counts
every id ever sent (ipyparallel's ``save_ids`` reads the new ones as
``history[-n:]``), and reading a forgotten index raises ``IndexError``.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import MutableSequence
from functools import wraps

from traitlets import TraitType

from ..wire.naming import engine_vid


class CallHistory(MutableSequence):
    """A list of msg_ids in which a broadcast's per-engine ids take one entry."""

    __slots__ = ("_items", "_ends", "_head", "_shapes", "limit")
    SHAPES_KEPT = 64  # target lists shared between entries (a call's uuids are kept once)

    def __init__(self, ids=(), limit: int = 0):
        self._items: list = []  # a msg_id, or (msg_id, uuids) for a broadcast
        self._ends = array("q")  # self._ends[k]: len(self) once item k is in
        self._head = 0  # index of the first id kept (ids before it are forgotten)
        self._shapes: dict = {}
        self.limit = limit  # entries kept at most (0: all)
        self.extend(ids)

    # ------------------------------------------------------------- growing
    def add_call(self, msg_id: str, uuids) -> None:
        """A broadcast's per-engine ids, ``engine_vid(msg_id, uuid)`` for each uuid."""
        uuids = tuple(uuids)
        if not uuids:
            return
        shared = self._shapes.get(uuids)
        if shared is None:
            if len(self._shapes) >= self.SHAPES_KEPT:
                self._shapes.clear()
            shared = self._shapes[uuids] = uuids
        self._add((msg_id, shared), len(shared))

    def append(self, msg_id) -> None:
        self._add(msg_id, 1)

    def extend(self, ids) -> None:
        if isinstance(ids, CallHistory):
            for item in list(ids._items):
                self._add(item, _size(item))
        else:
            for msg_id in list(ids):
                self.append(msg_id)

    def entries(self) -> list:
        """The entries: a msg_id, or ``(msg_id, uuids)`` for a broadcast."""
        return list(self._items)

    def tail(self, start: int) -> CallHistory:
        """The ids from index ``start`` on, sharing this history's entries."""
        out = CallHistory()
        start = max(self._head, min(start, len(self)))
        k = bisect_right(self._ends, start)
        if k < len(self._items) and self._start(k) < start:  # starts inside an entry: its rest
            out.extend(self[start : self._ends[k]])
            k += 1
        for item in self._items[k:]:
            out._add(item, _size(item))
        return out

    def _add(self, item, n: int) -> None:
        self._items.append(item)
        self._ends.append(len(self) + n)
        if self.limit and len(self._items) > self.limit:
            self._forget(len(self._items) - self.limit + self.limit // 10)  # a tenth more: amortized

    def _forget(self, k: int) -> None:
        """Drop the ``k`` oldest entries; the indices of the rest do not move."""
        self._head = self._ends[k - 1]
        del self._items[:k]
        del self._ends[:k]

    def _start(self, k: int) -> int:
        return self._ends[k - 1] if k else self._head

    # ------------------------------------------------------------- reading
    def __len__(self) -> int:
        return self._ends[-1] if self._ends else self._head

    @property
    def forgotten(self) -> int:
        """How many of the first ids were forgotten (``limit``)."""
        return self._head

    def __getitem__(self, index):
        if isinstance(index, slice):  # the ids kept in the slice
            return [self[i] for i in range(*index.indices(len(self))) if i >= self._head]
        n = len(self)
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError("history index out of range")
        if i < self._head:
            raise IndexError(
                f"history index {index} was forgotten: the history keeps the last "
                f"{self.limit} entries (Client.history_limit)"
            )
        k = bisect_right(self._ends, i)
        item = self._items[k]
        return item if isinstance(item, str) else engine_vid(item[0], item[1][i - self._start(k)])

    def __iter__(self):
        for item in self._items:
            if isinstance(item, str):
                yield item
            else:  # ``engine_vid`` for each, made in one comprehension (a save_ids per call)
                prefix = engine_vid(item[0], "")
                yield from [prefix + uuid for uuid in item[1]]

    def __reversed__(self):
        for i in range(len(self) - 1, self._head - 1, -1):
            yield self[i]

    def __contains__(self, msg_id) -> bool:
        if not isinstance(msg_id, str):
            return False
        call_id, _, uuid = msg_id.rpartition("_")  # a per-engine id (uuids have no "_")
        for item in self._items:
            if item == msg_id if isinstance(item, str) else (item[0] == call_id and uuid in item[1]):
                return True
        return False

    def __eq__(self, other) -> bool:
        if isinstance(other, (CallHistory, list, tuple)):
            return list(self) == list(other)
        return NotImplemented

    def __repr__(self) -> str:
        return repr(list(self))

    # ------------------------------------- editing in place (rare): as a list
    def _edit(self, edit) -> None:
        ids = list(self)
        edit(ids)
        self.clear()
        self.extend(ids)

    def clear(self) -> None:
        self._items.clear()
        self._ends = array("q")
        self._head = 0

    def __setitem__(self, index, value) -> None:
        self._edit(lambda ids: ids.__setitem__(index, value))

    def __delitem__(self, index) -> None:
        self._edit(lambda ids: ids.__delitem__(index))

    def insert(self, index, value) -> None:
        self._edit(lambda ids: ids.insert(index, value))


def _size(item) -> int:
    return 1 if isinstance(item, str) else len(item[1])


class History(TraitType):
    """A ``CallHistory`` trait; a list assigned to it (``purge_everything``) becomes one."""

    info_text = "a history of msg_ids"

    def make_dynamic_default(self):
        return CallHistory()

    def validate(self, obj, value):
        if isinstance(value, CallHistory):
            return value
        if isinstance(value, (list, tuple)):  # the limit stays
            old = obj._trait_values.get(self.name)
            return CallHistory(value, limit=old.limit if isinstance(old, CallHistory) else 0)
        self.error(obj, value)


def save_ids(method):
    """ipyparallel's ``save_ids``: the view's history and outstanding get the
    ids the call added to the client's, a broadcast as one history entry."""

    @wraps(method)
    def saving(self, *args, **kwargs):
        before = len(self.client.history)
        try:
            return method(self, *args, **kwargs)
        finally:
            new = self.client.history.tail(before)
            self.history.extend(new)
            self.outstanding.update(new)

    return saving
