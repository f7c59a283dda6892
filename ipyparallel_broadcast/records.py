"""The hub's task records for tree broadcasts, one per engine, as DirectView's.

The root copies each client request to the hub's monitor socket (topic
``inbcast``) and leaves copy each engine reply (``outbcast``), frames untouched.
The copies and the engines' IOPub reach the hub by different ways, in any
order: records are merged whichever comes first.
``BroadcastRecords`` takes those topics over from ipyparallel's own handlers
(which keep one record per call) and files them under each engine's id
``f"{msg_id}_{uuid}"``, the id the client's AsyncResult uses, so that
``rc.db_query``, ``rc.result_status``, ``rc.queue_status`` and
``rc.get_result`` see broadcasts as they see DirectView calls. Engines' outputs
(IOPub) for a broadcast are filed under the same per-engine ids.
"""

from __future__ import annotations

from collections import OrderedDict

from ipyparallel import util
from ipyparallel.controller.hub import init_record

from . import protocol as P
from .protocol import engine_vid

EARLY = 1_000  # results held until their request's copy comes (it travels apart)


class BroadcastRecords:
    """Per-engine task records for broadcasts, kept in ``hub.db``."""

    def __init__(self, hub):
        self.hub = hub
        self.log = hub.log
        self.early: OrderedDict = OrderedDict()  # vid -> (eid, result) seen before its request
        self.uuids: dict = {}  # engine id -> uuid, of every engine a broadcast targeted
        hub.monitor_handlers[P.INBCAST] = self.save_request
        hub.monitor_handlers[P.OUTBCAST] = self.save_result
        self._save_iopub = hub.save_iopub_message
        hub.save_iopub_message = self.save_iopub

    def _hold_early(self, vid, value):
        self.early[vid] = value
        while len(self.early) > EARLY:
            self.early.popitem(last=False)

    def save_request(self, idents, frames):
        """A client's ``ipb_request``: one pending record per target engine."""
        hub = self.hub
        try:
            envelope = hub.session.deserialize(frames, content=True)
            content = P.validate_request(envelope["content"])
            inner, own = envelope["buffers"], None
            if content.get("each") is not None:
                inner, own = P.split_each(inner, content["targets"], content["each"])
            request = hub.session.deserialize([P.as_bytes(f) for f in inner[:5]] + inner[5:])
        except Exception as e:
            self.log.error("broadcast:: dropped an invalid request copy: %s", e)
            return
        msg_id = request["header"]["msg_id"]
        request["header"]["date"] = P.parse_date(request["header"]["date"])  # once, not per record
        for eid in content["targets"]:
            engine = hub.engines.get(eid)
            if engine is None:
                continue  # the client refuses unknown engines; a race with unregistration
            vid = engine_vid(msg_id, engine.uuid)
            self.uuids[eid] = engine.uuid  # its output may come after it unregistered
            record = init_record(request)
            record.update(
                msg_id=vid,
                engine_uuid=engine.uuid,
                client_uuid=request["header"]["session"],
                queue="broadcast",
                buffers=request["buffers"] + (own[eid] if own else []),
            )
            self._store(vid, record)
            hub.pending.add(vid)
            hub.queues[eid].append(vid)
            if vid in self.early:
                self._finish(vid, *self.early.pop(vid))

    def save_result(self, idents, frames):
        """An engine's reply to a broadcast, as its leaf received it."""
        hub = self.hub
        try:
            msg = hub.session.deserialize(frames, content=True)
            msg_id = msg["parent_header"]["msg_id"]
            uuid = msg["metadata"]["engine"]
        except Exception as e:
            self.log.error("broadcast:: dropped an invalid result copy: %s", e)
            return
        vid = engine_vid(msg_id, uuid)
        eid = hub.by_ident.get(uuid.encode("utf8"))
        header, md = msg["header"], msg["metadata"]
        header["date"] = P.parse_date(header["date"])  # dateutil's parse costs ~50 us a date
        result = dict(
            result_header=header,
            result_metadata=md,
            result_content=msg["content"],
            result_buffers=msg["buffers"],
            started=P.parse_date(md.get("started")),
            completed=util.ensure_timezone(header["date"]),
            received=util.utcnow(),
        )
        outputs = md.get(P.OUTPUTS_KEY)
        if isinstance(outputs, dict):  # our engine's outputs, in the reply (see kernel)
            result.update(stdout=outputs.get("stdout") or "", stderr=outputs.get("stderr") or "",
                          outputs=list(outputs.get("outputs") or ()))
        if vid in hub.pending or vid in hub.all_completed:
            self._finish(vid, eid, result)
        else:
            self._hold_early(vid, (eid, result))  # its request copy is behind

    def _finish(self, vid, eid, result):
        hub = self.hub
        if vid in hub.pending:
            hub.pending.discard(vid)
            hub.all_completed.add(vid)
            if eid is not None:
                if vid in hub.queues[eid]:
                    hub.queues[eid].remove(vid)
                hub.completed[eid].append(vid)
        try:
            hub.db.update_record(vid, result)
        except Exception:
            self.log.error("DB Error saving broadcast result %r", vid, exc_info=True)

    def _store(self, vid, record):
        db = self.hub.db
        try:
            existing = db.get_record(vid)  # IOPub may come first
        except KeyError:
            existing = None
        try:
            if existing is None:
                db.add_record(vid, record)
            else:
                db.update_record(vid, {k: v for k, v in record.items() if not existing.get(k)})
        except Exception:
            self.log.error("DB Error saving broadcast request %r", vid, exc_info=True)

    def save_iopub(self, topics, msg):
        """File an engine's output for a broadcast under its per-engine id."""
        parent = msg.get("parent_header") or {}
        msg_id = parent.get("msg_id")
        if P.is_broadcast_id(msg_id):  # known by its id: it may come before the request
            uuid = msg["metadata"].get("engine") or self.uuids.get(P.engine_of_topic(topics))
            if uuid is None:  # not one of ours: a record without a request would be junk
                self.log.debug("iopub:: output of unknown engine for broadcast %s dropped", msg_id)
                return None
            msg["parent_header"] = dict(parent, msg_id=engine_vid(msg_id, uuid))
        return self._save_iopub(topics, msg)
