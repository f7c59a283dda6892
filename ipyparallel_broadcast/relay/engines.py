"""A leaf's engine table: engine id -> uuid, with the inverse kept beside it."""

from __future__ import annotations


class EngineTable(dict):
    """``{eid: uuid}`` that also answers ``eids_of(uuid)`` without a scan (a host
    that leaves loses its engines one by one: a scan each is O(N²) at 10,000).
    The node's parts share one table and change it in place; every change goes
    through the methods below, which keep the inverse."""

    def __init__(self):
        super().__init__()
        self._by_uuid: dict[str, set[int]] = {}

    def eids_of(self, uuid: str) -> list[int]:
        return sorted(self._by_uuid.get(uuid, ()))

    def __setitem__(self, eid: int, uuid: str):
        if eid in self:
            self._unindex(eid)
        super().__setitem__(eid, uuid)
        self._by_uuid.setdefault(uuid, set()).add(eid)

    def __delitem__(self, eid: int):
        self._unindex(eid)
        super().__delitem__(eid)

    def _unindex(self, eid: int):
        uuid = super().__getitem__(eid)
        eids = self._by_uuid.get(uuid)
        if eids is not None:
            eids.discard(eid)
            if not eids:
                del self._by_uuid[uuid]

    def update(self, *args, **kwargs):
        for eid, uuid in dict(*args, **kwargs).items():
            self[eid] = uuid

    def setdefault(self, eid: int, uuid: str):
        if eid not in self:
            self[eid] = uuid
        return self[eid]

    def pop(self, eid: int, *default):
        if eid not in self:
            if default:
                return default[0]
            raise KeyError(eid)
        uuid = self[eid]
        del self[eid]
        return uuid

    def clear(self):
        super().clear()
        self._by_uuid.clear()

    def popitem(self):
        raise TypeError("EngineTable.popitem: remove an engine by its id")
