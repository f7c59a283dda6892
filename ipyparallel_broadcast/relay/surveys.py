"""Stats surveys in flight at a node (``ipb_stats``, see ``protocol``).

A survey goes down to every child; each answers with its subtree's stats,
and the node answers up once all have (a lost child answers with an error).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..wire import protocol as P
from .events import DOWN, UP, Send
from .routes import Key


@dataclass
class Survey:
    route: list
    msg_id: object
    owed: set[Key]  # children that have not answered
    nodes: list  # the stats gathered so far, this node's first


class Surveys:
    def __init__(self, codec: P.Codec):
        self.codec = codec
        self.active: dict[str, Survey] = {}

    def __len__(self):
        return len(self.active)

    def msg_ids(self) -> set:
        return {s.msg_id for s in self.active.values()}

    def start(self, key, route, content: dict, idents: dict[Key, bytes], own: dict) -> list[Send]:
        """Ask every child (``idents``) for its stats; ``own``: this node's."""
        if not isinstance(key, str) or key in self.active:
            raise P.ProtocolError("stats request without a usable key")
        self.active[key] = Survey(route, content.get("msg_id"), set(idents), [own])
        down = self.codec.pack(P.STATS, dict(req=key, trace=own_trace(content)))
        return [Send(DOWN, [ident] + down) for ident in idents.values()] + self._done(key)

    def reply(self, child: Key, content: dict) -> list[Send]:
        key, nodes = content.get("req"), content.get("nodes")
        survey = self.active.get(key) if isinstance(key, str) else None
        if survey is None or child not in survey.owed or not isinstance(nodes, list):
            raise P.ProtocolError(f"unexpected stats reply for {key!r}")
        survey.owed.discard(child)
        survey.nodes.extend(n for n in nodes if isinstance(n, dict))
        return self._done(key)

    def child_lost(self, child: Key, node: str, error: str) -> list[Send]:
        sends = []
        for key, survey in list(self.active.items()):
            if child in survey.owed:
                survey.owed.discard(child)
                survey.nodes.append(dict(node=node, error=error))
                sends += self._done(key)
        return sends

    def _done(self, key) -> list[Send]:
        survey = self.active[key]
        if survey.owed:
            return []
        del self.active[key]
        reply = dict(req=key, msg_id=survey.msg_id, nodes=survey.nodes)
        return [Send(UP, survey.route + self.codec.pack(P.STATS_REPLY, reply))]


def own_trace(content: dict):
    """The traced request whose events a survey asks for, if any."""
    trace = content.get("trace")
    return trace if isinstance(trace, str) else None
