"""The hub's task records for tree broadcasts, one per engine, as DirectView's.

The root copies each client request to the hub's monitor socket (topic
``inbcast``) and each bundle of replies it sends up (``ipb_outbundle``); the
leaves copy each engine's reply to a reduction (``outbcast``), whose bundles
carry only the combined value. Frames are copied untouched.
The copies and the engines' IOPub reach the hub by different ways, in any
order: records are merged whichever comes first.
A request's buffers of ``protocol.RECORD_LIMIT`` bytes or more are left out
of its copy (``protocol.strip_big``): the hub keeps the request's metadata, not
a second copy of the user's data in the controller's memory. Only
``rc.resubmit`` would read them back; it refuses such records with a clear error.
Likewise a reply whose big buffers went to a client of the engines' host by
shared memory is filed as an error saying so (``not_kept``).
``BroadcastRecords`` takes those topics over from ipyparallel's own handlers
(which keep one record per call) and files them under each engine's id
``f"{msg_id}_{uuid}"``, the id the client's AsyncResult uses, so that
``rc.db_query``, ``rc.result_status``, ``rc.queue_status`` and
``rc.get_result`` see broadcasts as they see DirectView calls. Engines' outputs
(IOPub) for a broadcast are filed under the same per-engine ids.

Filing is lazy: the copies wait, unread, in a journal, and are filed (in the
order they came) only when something may read the records: any client query
to the hub (``db_query``, ``result_status``, ``queue_status``,
``get_result``, ...) and an engine's unregistration. A coalesced call to
1,024 engines costs the hub 2 appends, not 1,024 records, unless someone asks.
The journal keeps copies of the last ``JOURNAL_FACTOR * record_limit`` engine
outcomes (and ``size_limit`` bytes) of the in-memory DB: older ones are dropped
unfiled, as the DB would have culled their records. With any other DB
(SQLite, Mongo) nothing is dropped: the oldest copies are filed instead, and
every copy within ``FILE_EVERY`` seconds, so that a store that outlives the hub
keeps what a killed hub had (``sqlstore``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from functools import partial
from itertools import islice

from ipyparallel import error, util
from ipyparallel.controller.hub import init_record
from tornado.ioloop import PeriodicCallback

from ..compat.ipp import RecordsSeam
from ..wire import bundles as B
from ..wire import protocol as P
from ..wire.naming import engine_of_topic, engine_vid, is_broadcast_id, parse_date
from .journal import Journal

EARLY = 1_000  # results held until their request's copy comes (it travels apart)
FILE_EVERY = 1.0  # seconds: a persistent store's copies wait no longer (SQLite commits every 2 s)
JOURNAL_FACTOR = 4  # copies kept unfiled, per record the in-memory DB may hold


def owned(buffers: list) -> list:
    """Buffers as bytes of their own: a copy's buffers are zmq frames (or
    views of them) until filed, and the DB copies its records."""
    return [b if type(b) is bytes else P.as_bytes(b) for b in buffers]


class _RecentSet:
    """A set that forgets its oldest members past ``bound``."""

    def __init__(self, bound: int):
        self.bound, self._items = bound, OrderedDict()

    def add(self, item):
        self._items[item] = None
        while len(self._items) > self.bound:
            self._items.popitem(last=False)

    def __contains__(self, item):
        return item in self._items

    def __len__(self):
        return len(self._items)


class BroadcastDictDB(RecordsSeam):
    """ipyparallel's in-memory DictDB, for a hub that files a record per engine
    of each broadcast (the controller's default).

    - Culls the oldest records in the order they were added. DictDB sorts every
      record by date at each cull; with 1,024 engines a call, that was a third
      of the hub's time.
    - Remembers the ids it culled for a bounded while (DictDB keeps all of them,
      in a set shared by every instance: a leak of one id per engine per call).
    - Never holds more than ``record_limit`` records (DictDB culls none when
      ``record_limit * cull_fraction`` is below one).
    - Counts buffer bytes and reads its limits without traitlets per record.
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._culled = _RecentSet(10 * max(self.record_limit, 1))
        # plain attributes: DictDB keeps its byte count in a trait, and every
        # record's += and limit check went through traitlets' machinery
        self._bytes = 0
        self._limits = (self.record_limit, self.size_limit, self.cull_fraction)

    @staticmethod
    def _nbytes(rec) -> int:
        return sum(len(buf) for key in ("buffers", "result_buffers") for buf in rec.get(key) or ())

    def _count_bytes(self, rec):
        self._bytes += self._nbytes(rec)
        self._cull_if_over()

    def _uncount_bytes(self, rec):
        self._bytes -= self._nbytes(rec)

    def _cull_if_over(self):
        count, size, fraction = self._limits
        if len(self._store) > count:
            self._cull_first(int(fraction * count))
        if self._bytes > size:
            before, n = self._bytes, len(self._store)
            while self._bytes > size * (1 - fraction) and self._store:
                self._cull_first(1)
            self.log.info(
                "%i records with %i buffer bytes exceed the limit of %i: culled the oldest %i",
                n,
                before,
                size,
                n - len(self._store),
            )

    def _cull_first(self, n=1):
        n = max(n, len(self._store) - self._limits[0])  # DictDB culls 0 when limit*fraction < 1
        for msg_id in list(islice(self._store, n)):
            self._culled.add(msg_id)
            self.drop_record(msg_id)

    def add_or_fill(self, msg_id, rec):
        """Add a record, or fill the empty fields of one already there (its
        engine's output may come before the request), without copying it."""
        existing = self._store.get(msg_id)
        if existing is None:
            self.add_record(msg_id, rec)
        else:
            self.update_record(msg_id, {k: v for k, v in rec.items() if not existing.get(k)})


def not_kept(md, eid) -> dict:
    """A record's result whose big buffers went to its caller by shared memory
    (``host.shm.share_reply``): the hub never had them, and says so when asked."""
    return dict(
        status="error",
        ename="ResultNotKept",
        evalue="its big buffers went to the calling client by shared memory, not through the hub; call again",
        traceback=[],
        engine_info=dict(engine_uuid=md.get("engine"), engine_id=eid, method="apply"),
    )


class BroadcastRecords:
    """Per-engine task records for broadcasts, kept in ``hub.db``."""

    def __init__(self, hub):
        self.hub = hub
        self.log = hub.log
        self.early: OrderedDict = OrderedDict()  # vid -> (eid, result) seen before its request
        self.uuids: dict = {}  # engine id -> uuid, of every engine a broadcast targeted
        self.codec = P.Codec(hub.session)
        db = hub.db
        drops = isinstance(db, BroadcastDictDB)  # else the oldest are filed, never dropped
        limits = (db.record_limit, db.size_limit) if drops else (256, 2**28)
        self.journal = Journal(JOURNAL_FACTOR * max(limits[0], 1), limits[1], drops, self.log)
        self.filing = None  # a store that outlives the hub: its copies filed every FILE_EVERY seconds
        if not drops:
            self.filing = PeriodicCallback(self.file_all, 1e3 * FILE_EVERY)
            self.filing.start()

    def copy_handlers(self) -> dict:
        """The hub's monitor handlers for the tree's copies: journaled, filed when read."""
        return {
            topic: partial(self.journal.defer, handler)
            for topic, handler in (
                (P.INBCAST, self.save_request),
                (P.OUTBCAST, self.save_result),
                (P.OUTBUNDLE, self.save_bundle),
            )
        }

    # ------------------------------------------------------------- filing
    def file_all(self):
        """File every copy waiting in the journal, oldest first."""
        self.journal.file_all()

    def refused_resubmit(self, client_id, msg) -> bool:
        """A resubmit of records filed without their big buffers: refused, answered (True)."""
        hub = self.hub
        try:
            ids = list(msg["content"]["msg_ids"])
            records = hub.db.find_records({"msg_id": {"$in": ids}}, keys=["buffers"])
            stripped = [r["msg_id"] for r in records if any(map(P.is_stripped, r.get("buffers") or ()))]
            if stripped:
                raise ValueError(
                    f"cannot resubmit {stripped}: their request buffers of "
                    f"{P.RECORD_LIMIT} bytes or more were not kept by the hub; "
                    "call the view again instead"
                )
        except ValueError:
            reply = error.wrap_exception()
            hub.session.send(hub.query, "resubmit_reply", content=reply, ident=client_id, parent=msg)
            return True
        except Exception:  # ipyparallel's own handler reports malformed requests
            pass
        return False

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
            if str(e).startswith("Duplicate Signature"):  # a call the client sent again (``client.copies``)
                self.log.debug("broadcast:: a request sent again: its records are filed")
                return
            self.log.error("broadcast:: dropped an invalid request copy: %s", e)
            return
        msg_id = request["header"]["msg_id"]
        request["header"]["date"] = parse_date(request["header"]["date"])  # once, not per record
        # the hub's traits, read once (each read goes through traitlets)
        engines, pending, queues, store = hub.engines, hub.pending, hub.queues, self._storer(hub.db)
        shared = owned(request["buffers"])
        for eid in content["targets"]:
            engine = engines.get(eid)
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
                buffers=shared + (owned(own[eid]) if own else []),
            )
            store(vid, record)
            pending.add(vid)
            queues[eid].append(vid)
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
        self._save_reply(msg_id, uuid, msg)

    def save_bundle(self, idents, frames):
        """A bundle the root sent up (nested ones included): each reply in it is filed."""
        try:
            msg = self.codec.unpack(frames, content=False)
            msg_id = msg["metadata"]["msg_id"]
            outcomes = list(B.iter_bundle(self.codec, msg))
        except Exception as e:
            self.log.error("broadcast:: dropped an invalid bundle copy: %s", e)
            return
        for what, item in outcomes:
            try:
                reply = self.codec.unpack(item) if what == "reply" else item if what == "parsed" else None
                if reply is not None:
                    self._save_reply(msg_id, reply["metadata"]["engine"], reply)
            except Exception as e:
                self.log.error("broadcast:: dropped a reply in a bundle copy: %s", e)

    def _save_reply(self, msg_id, uuid, msg):
        hub = self.hub
        vid = engine_vid(msg_id, uuid)
        eid = hub.by_ident.get(uuid.encode("utf8"))
        header, md = msg["header"], msg["metadata"]
        header["date"] = parse_date(header["date"])  # dateutil's parse costs ~50 us a date
        result = dict(
            result_header=header,
            result_metadata=md,
            result_content=msg["content"] if P.SHM_KEY not in md else not_kept(md, eid),
            result_buffers=owned(msg["buffers"]),
            started=parse_date(md.get("started")),
            completed=util.ensure_timezone(header["date"]),
            received=util.utcnow(),
        )
        outputs = md.get(P.OUTPUTS_KEY)
        if isinstance(outputs, dict):  # our engine's outputs, in the reply (see kernel)
            result.update(
                stdout=outputs.get("stdout") or "",
                stderr=outputs.get("stderr") or "",
                outputs=list(outputs.get("outputs") or ()),
            )
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
        except KeyError:  # culled (the DB's record limit) before its result came
            self.log.debug("broadcast:: no record %r to save the result in", vid)
        except Exception:
            self.log.error("DB Error saving broadcast result %r", vid, exc_info=True)

    def _storer(self, db):
        """How to file a new record in ``db``: ours adds or fills in place."""
        if isinstance(db, BroadcastDictDB):
            return db.add_or_fill
        return partial(self._store, db)

    def _store(self, db, vid, record):
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

    @staticmethod
    def takes_iopub(msg) -> bool:
        """An engine's output for a broadcast (filed per engine, after its request's copy)."""
        return is_broadcast_id((msg.get("parent_header") or {}).get("msg_id"))

    def save_iopub(self, topics, msg, save: Callable[[list, dict], None]):
        """File a broadcast's output under its per-engine id (``save``: the hub's filing)."""
        self.journal.defer(partial(self._save_broadcast_iopub, save=save), topics, msg)

    def _save_broadcast_iopub(self, topics, msg, *, save):
        parent, msg_id = msg["parent_header"], msg["parent_header"]["msg_id"]
        uuid = msg["metadata"].get("engine") or self.uuids.get(engine_of_topic(topics))
        if uuid is None:  # not one of ours: a record without a request would be junk
            self.log.debug("iopub:: output of unknown engine for broadcast %s dropped", msg_id)
            return
        msg["parent_header"] = dict(parent, msg_id=engine_vid(msg_id, uuid))
        save(topics, msg)
