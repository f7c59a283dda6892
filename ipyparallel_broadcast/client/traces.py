"""What the client notes of its own traced calls: when each request went out,
each reply came in and the call was done, and each engine's stamps from its
reply (the relay nodes' come from a stats survey; ``display.trace`` merges
and draws them)."""

from __future__ import annotations

from collections import OrderedDict

from ..wire.naming import parse_date


def event(where: str, what: str, time: float, detail=None) -> dict:
    return dict(where=where, event=what, time=time, detail=detail)


class Traces(OrderedDict):
    """The client's own events of its recent traced calls: ``msg_id -> events``
    (a dict, so that ``msg_id in traces``, asked of every call, stays in C)."""

    kept = 64

    def start(self, msg_id: str) -> list:
        events = self[msg_id] = []
        while len(self) > self.kept:
            self.popitem(last=False)
        return events

    def add(self, msg_id: str, what: str, time: float, detail=None):
        events = self.get(msg_id)
        if events is not None:
            events.append(event("client", what, time, detail))

    def add_engine(self, msg_id: str, eid, reply: dict):
        """The engine's stamps, from its reply's metadata and header."""
        events = self.get(msg_id)
        if events is None:
            return
        where, md = f"engine {eid}", reply["metadata"]
        if isinstance(md.get("ipb_received"), (int, float)):
            events.append(event(where, "received", md["ipb_received"]))
        for what, stamp in (("started", md.get("started")), ("finished", reply["header"].get("date"))):
            when = _seconds(stamp)
            if when is not None:
                events.append(event(where, what, when))

    def events(self, msg_id: str) -> list:
        return list(self.get(msg_id, ()))


def _seconds(stamp) -> float | None:
    if isinstance(stamp, str):
        try:
            return parse_date(stamp).timestamp()
        except (TypeError, ValueError):
            return None
    return stamp.timestamp() if hasattr(stamp, "timestamp") else None
