"""Serving ipyparallel's own ``BroadcastView`` (a stock client), unchanged.

Its requests are plain ``apply_request``/``execute_request`` messages with
``metadata = {targets: [[uuid, id], ...], is_broadcast, is_coalescing}``.
Non-coalescing, it expects one reply per engine whose parent ``msg_id`` is
``f"{msg_id}_{uuid}"``; coalescing, one reply whose buffers are all results,
described by ``metadata.broadcast_targets``. This path costs more than ours
(per-engine re-signing, parsing at the root) and exists for compatibility.
"""

from __future__ import annotations

from ..wire import bundles as B
from ..wire import protocol as P


def renamer(codec: P.Codec, inner):
    """Per-engine copies of a request with ``msg_id = f"{msg_id}_{uuid}"``.
    ``inner``: its frames, or the message already unpacked."""
    msg = dict(inner) if isinstance(inner, dict) else codec.unpack(inner)
    msg["metadata"] = dict(msg["metadata"])
    header, buffers = msg["header"], msg["buffers"]
    original = header["msg_id"]
    msg["metadata"].pop("targets", None)
    msg["metadata"]["original_msg_id"] = original

    def rename(uuid: str) -> list:
        renamed = dict(header, msg_id=f"{original}_{uuid}")
        return (
            codec.serialize(header["msg_type"], msg["content"], msg["parent_header"], msg["metadata"], header=renamed)[
                1:
            ]
            + buffers
        )

    return rename


class CompatRequest:
    msg_types = ("apply_request", "execute_request")
    RENAME = "rename"
    RAW = "raw"

    def __init__(self, msg, targets, coalescing, inner):
        self.msg = msg
        self.header = header = msg["header"]
        self.targets = targets  # [[uuid, eid], ...] in the client's order
        self.uuids = {eid: uuid for uuid, eid in targets}
        self.coalescing = coalescing
        self.inner = inner
        eids = [eid for _, eid in targets]
        self.content = P.request_content(header["msg_id"], eids, P.COALESCE if coalescing else P.STREAM)
        # leaves keep replies as the engines signed them; non-coalescing
        # clients also need a per-engine msg_id
        self.content["compat"] = self.RAW if coalescing else self.RENAME
        P.validate_request(self.content)

    @classmethod
    def parse(cls, msg, body) -> CompatRequest:
        md = msg["metadata"]
        targets = md.get("targets") if isinstance(md, dict) else None
        if not md or not md.get("is_broadcast"):
            raise P.ProtocolError("not a broadcast request")
        if not isinstance(targets, list) or not all(
            isinstance(t, list) and len(t) == 2 and isinstance(t[0], str) and type(t[1]) is int for t in targets
        ):
            raise P.ProtocolError("metadata.targets must be [[uuid, engine id], ...]")
        return cls(msg, targets, bool(md.get("is_coalescing")), body)

    @property
    def reply_type(self) -> str:
        return self.header["msg_type"].replace("_request", "_reply")

    def replies(self, codec: P.Codec, kind, parts, failed) -> list[list]:
        """Message bodies (no idents) for the stock client.

        Engines the hub unregistered (``P.DIED``) get no reply from us: a stock
        client fails their requests itself on the hub's notification, and a
        second answer would raise in its reply handler (``InvalidStateError``)
        and stall its broadcast stream. A coalesced request with such an engine
        is likewise left to the client, which then raises its EngineError.
        """
        outcomes = list(B.flatten(codec, kind, parts, failed))
        died = [o for o in outcomes if o[0] == "failed" and o[1][3:4] == [P.DIED]]
        if not self.coalescing:
            return [
                body if what == "reply" else self._error_body(codec, *body[:3])
                for what, body in outcomes
                if (what, body) not in died
            ]
        if died:
            return []
        return [self._coalesced_body(codec, outcomes)]

    def _error_content(self, eid, uuid, message) -> dict:
        info = dict(engine_uuid=uuid, engine_id=eid, method=self.reply_type[:-6])
        return dict(
            status="error",
            ename="EngineError",
            evalue=message,
            traceback=[f"EngineError: {message}"],
            engine_info=info,
        )

    def _error_body(self, codec, eid, uuid, message) -> list:
        uuid = uuid or self.uuids.get(eid)  # the client's own name for the engine
        original = self.header["msg_id"]
        parent = dict(self.header, msg_id=f"{original}_{uuid}")
        metadata = dict(engine=uuid, is_broadcast=True, status="error")
        content = self._error_content(eid, uuid, message)
        return codec.serialize(self.reply_type, content, parent, metadata)[1:]

    def _coalesced_body(self, codec, outcomes) -> list:
        by_uuid, errors = {}, []
        for what, item in outcomes:
            if what == "reply":
                reply = codec.unpack(item)
                by_uuid[reply["metadata"].get("engine")] = reply
            else:
                errors.append(self._error_content(*item[:3]))
        ordered = [(u, e) for u, e in self.targets if u in by_uuid]
        replies = [by_uuid[u] for u, _ in ordered]
        errors = [r["content"] for r in replies if r["content"].get("status") != "ok"] + errors
        metadata = dict(
            is_broadcast=True,
            is_coalescing=True,
            original_msg_id=self.header["msg_id"],
            broadcast_targets=[list(t) for t in (ordered or self.targets)],
        )
        if replies and "started" in replies[0]["metadata"]:
            metadata["started"] = replies[0]["metadata"]["started"]
        buffers = [] if errors else [b for r in replies for b in r["buffers"]]
        content = errors[0] if errors else dict(status="ok")
        metadata["status"] = content["status"]
        return codec.serialize(self.reply_type, content, self.header, metadata)[1:] + buffers
