"""Where the client reaches into ``ipyparallel.Client``'s internals (with
``streams``, how its sockets are read).

``Upstream`` is the broadcast client's base: ipyparallel's Client, with the
private methods it must override (how targets resolve, how jobs are waited on,
found, aborted, sent) and the per-engine
futures ipyparallel's AsyncResult reads, made on demand. Everything here
follows ipyparallel's own names and caches (``_futures``, ``_output_futures``,
``outstanding``, ``history``, ``results``, ``metadata``); when ipyparallel
changes them, this module is what changes. ``client.Client`` builds the
broadcast on top of it.
"""

from __future__ import annotations

from collections import defaultdict
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FuturesTimeout
from functools import partial
from threading import current_thread

import ipyparallel as ipp
from ipyparallel import error
from ipyparallel.client.client import Metadata
from ipyparallel.client.futures import MessageFuture

from ..compat import ipp as seam
from ..wire.naming import parse_date
from .calls import FAILED, Call
from .guard import guarded_callback
from .results import engine_result, outcome_metadata
from .streams import StreamReaders

_SENT = Future()
_SENT.set_result(None)


class EngineFuture(MessageFuture):
    """A MessageFuture without the Event and tracker Future it does not need
    (made only for a reduction, or for engines someone waits on one by one)."""

    def __init__(self, msg_id, header=None, *, track=False):
        Future.__init__(self)
        self.msg_id = msg_id
        self.header = header
        self.track = track
        seam.future_without_tracker(self)
        self.tracker = Future() if track else _SENT
        self.iopub_callbacks = []
        self.output = None
        self.broadcast_id = None  # the msg_id of the broadcast this is part of

    def wait(self, timeout=None):
        try:
            self.exception(timeout)
        except FuturesTimeout:
            return False
        except CancelledError:
            pass
        return True


class CallMetadata(defaultdict):
    """``Client.metadata``: a broadcast engine's per-engine id finds that
    engine's Metadata in its call (made on first read, never copied here)."""

    def __init__(self, client):
        super().__init__(Metadata)
        self.client = client

    def __missing__(self, key):
        call, i = self.client._calls.of_vid(key)
        if call is None:
            return super().__missing__(key)
        return outcome_metadata(self.client, call, i)


class EngineOutstanding(set):
    """One engine's set in ``Client._outstanding_by_engine``: its broadcasts'
    per-engine ids are *in* it, without being added, until its outcome is in."""

    def __init__(self, calls, uuid):
        super().__init__()
        self.calls, self.uuid = calls, uuid

    def __contains__(self, key):
        if set.__contains__(self, key):
            return True
        call, i = self.calls.of_vid(key)
        return (
            call is not None
            and call.uuids[i] == self.uuid
            and call.outcomes[i] is None
            and call.msg_id in self.calls.live
        )


class OutstandingByEngine(defaultdict):
    """``Client._outstanding_by_engine``: engine uuid -> its ``EngineOutstanding``."""

    def __init__(self, calls):
        super().__init__()
        self.calls = calls

    def __missing__(self, uuid):
        value = self[uuid] = EngineOutstanding(self.calls, uuid)
        return value


class Upstream(StreamReaders, seam.ClientSeam):
    """ipyparallel's Client, adapted to calls that reach many engines at once."""

    def _targets_of(self, targets):
        """ipyparallel's: ``(uuids as bytes, engine ids)``; see ``_uuids_of``."""
        uuids, eids = self._uuids_of(targets)
        return [u.encode("utf8") for u in uuids], eids

    def _uuids_of(self, targets):
        """``(uuids, engine ids)`` of ``targets``, as ipyparallel's ``_targets_of``
        resolves them, with a clear error for an engine that is not registered
        (it died or never came) instead of a bare ``KeyError``, and the engine
        table read once (ipyparallel reads its traitlet once per target)."""
        try:
            if (targets is None or isinstance(targets, str) and targets.lower() == "all") and self._engine_ids:
                targets = self._engine_ids
            if isinstance(targets, (tuple, list, range)):
                engines, lookup = self._engine_table, dict.get  # (ReverseDict's own lookup is Python)
                uuids = [lookup(engines, t) for t in targets]
                if None in uuids:  # a reverse lookup, or the KeyError below
                    uuids = [engines[t] for t in targets]
                return uuids, list(targets)
            idents, eids = super()._targets_of(targets)
            return [i.decode("utf8") for i in idents], eids
        except KeyError as e:
            raise IndexError(
                f"Engine {e.args[0]!r} is not registered: it died or never registered (registered engines: {self.ids})"
            ) from None

    def _children_of(self, call: Call) -> list:
        """Per-engine futures of a call, made once by any thread; the I/O
        thread settles them (those already in: at once if the call is complete)."""
        with self._children_lock:  # the I/O thread finishes calls under it (``ReplyFiling.call_finished``)
            if call.children is not None:
                return call.children
            children = []
            live = call.msg_id in self._calls.live  # IOPub callbacks reach a live call's
            for i, vid in enumerate(call.vids):
                child = EngineFuture(vid, call.header)
                child.output = EngineFuture(vid, call.header)
                child.output.metadata = outcome_metadata(self, call, i)
                child.broadcast_id = call.msg_id
                children.append(child)
                if live:
                    self._reply_futures.setdefault(vid, child)
                    self._iopub_futures.setdefault(vid, child.output)
            call.children = children
            ready = [i for i, o in enumerate(call.outcomes) if o is not None]
        if call.future.done() or current_thread() is self._loop_thread:  # results unpacked already
            self._settle_children(call, ready)
        else:  # results are unpacked on the I/O thread only: once each
            self._loop.add_callback(self._settle_children, call, ready)
        return children

    def _settle_children(self, call: Call, indices):
        children = call.children
        for i in indices:
            child = children[i]
            if not child.done():
                child.set_result(engine_result(self, call, i))
            o = call.outcomes[i]
            if (o[0] == FAILED or not o[2]) and not child.output.done():
                child.output.set_result(None)

    def purge_local_results(self, jobs=(), targets=()):
        """ipyparallel's; purged broadcasts are no longer recalled by ``get_result``."""
        super().purge_local_results(jobs, targets)
        if jobs == "all":
            self._calls.recent.clear()
            return
        for job in [jobs] if isinstance(jobs, (str, int, ipp.AsyncResult)) else jobs:
            ids = (
                job.msg_ids
                if isinstance(job, ipp.AsyncResult)
                else [self.history[job] if isinstance(job, int) else job]
            )
            for vid in ids:
                call = self._calls.of_vid(vid)[0]
                if call is not None:
                    self._calls.recent.pop(call.msg_id, None)

    def wait(self, jobs=None, timeout=-1):
        """ipyparallel's; a broadcast's AsyncResult or per-engine id waits on its call."""
        if jobs is not None:
            many = not isinstance(jobs, (str, int, ipp.AsyncResult)) and hasattr(jobs, "__iter__")
            jobs = [self._waitable(j) for j in (jobs if many else [jobs])]
        return super().wait(jobs, timeout)

    def _waitable(self, job):
        job = self.history[job] if isinstance(job, int) else job
        call = getattr(job, "_call", None)
        if call is None and isinstance(job, str):
            call = self._calls.of_vid(job)[0]
        return call.future if call is not None else job

    def _result_of_jobs(self, jobs=None, owner=False):
        many = isinstance(jobs, (list, tuple, set))
        for job in jobs if many else [jobs]:
            job = self.history[job] if isinstance(job, int) else job
            call, i = self._calls.of_vid(job)
            if call is None:
                continue
            if call.future.done():  # recent: its result, as ipyparallel caches one
                self.results[job] = engine_result(self, call, i)
            else:  # in flight: that engine's future
                self._children_of(call)
        return super()._result_of_jobs(jobs, owner=owner)

    def abort(self, jobs=None, targets=None, block=None):
        """ipyparallel's abort; a broadcast's per-engine ids are translated to
        the one msg_id its engines know."""
        jobs = list(self.outstanding) if jobs is None else jobs
        if isinstance(jobs, (str, ipp.AsyncResult)):
            jobs = [jobs]
        msg_ids = []
        for job in jobs:
            ids = job.msg_ids if isinstance(job, ipp.AsyncResult) else [job]
            for i in ids:
                call = self._calls.of_vid(i)[0] if isinstance(i, str) else None
                msg_ids.append(call.msg_id if call is not None else i)
        return super().abort(list(dict.fromkeys(msg_ids)), targets=targets, block=block)

    def _send_message(self, socket, msg_type, *args, ident=None, track_outstanding=False, **kwargs):
        """ipyparallel's, and a request to one engine that is gone by the time it
        is sent fails as its engine's death does, instead of waiting forever:
        ipyparallel files a request under its engine only if the engine is
        registered when it looks, and fails what is filed when the engine
        unregisters, so a request sent across that moment was never answered
        (it hung ``scatter`` under overlapping faults, issue 32). The check runs
        on the I/O thread after the send, where unregistrations are handled."""
        uuid = None
        if track_outstanding and ident:
            uuid = (ident[-1] if isinstance(ident, list) else ident).decode("utf-8")
            eid = self._engine_table.get(uuid)
        future = super()._send_message(
            socket, msg_type, *args, ident=ident, track_outstanding=track_outstanding, **kwargs
        )
        if uuid is not None and future is not None:
            self._loop.add_callback(
                guarded_callback(partial(self._fail_if_engine_gone, future.msg_id, uuid, eid), "engine check")
            )
        return future

    def _fail_if_engine_gone(self, msg_id, uuid, eid):
        if self._engine_table.get(uuid) is not None or msg_id not in self.outstanding or msg_id in self.results:
            return  # still registered: its unregistration will fail what it holds
        why = f"Engine {eid if eid is not None else uuid!r} is gone (it died or unregistered): "
        self._file_apply_reply(self._engine_error_reply(msg_id, uuid, why + f"request {msg_id!r} did not reach it"))

    def _engine_error_reply(self, msg_id: str, uuid: str | None, text: str) -> dict:
        """A reply to ``msg_id`` carrying ``EngineError(text)``, made here as
        ipyparallel makes one for a request its dead engine still owed."""
        try:
            raise error.EngineError(text)
        except error.EngineError:
            content = error.wrap_exception()
        msg = self.session.msg("apply_reply", content=content)
        msg["parent_header"]["msg_id"] = msg_id
        msg["metadata"]["engine"] = uuid
        return msg

    def _metadata_of(self, msg):
        """ipyparallel's, with the engine's start time parsed by the fast C parser."""
        started = msg["metadata"].pop("started", None)
        md = super()._metadata_of(msg)
        if started is not None:
            msg["metadata"]["started"] = started
            md["started"] = parse_date(started)
        return md
