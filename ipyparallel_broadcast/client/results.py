"""Results of broadcasts: one AsyncResult per call over a ``calls.Call``.

ipyparallel's AsyncResult waits on two futures per engine. ``TreeAsyncResult``
waits on the call's own two (results, outputs). Its per-engine parts are
built when read: ``metadata`` (and ``stdout``, ``engine_id``, ...) makes each
engine's ``Metadata`` from its outcome; iterating a call still in flight,
``stream_output`` or ``split`` make per-engine futures, which the client then
settles as outcomes come. The rest of AsyncResult's API is unchanged.

``outcome_result`` and ``outcome_metadata`` turn one engine's outcome into
what ipyparallel's reply handlers would have filed: the adapter between the
pure ``calls`` core and ipyparallel's result types.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import weakref
from concurrent.futures import Future
from threading import Event, Lock

from ipyparallel import error
from ipyparallel.client.client import ExecuteReply, Metadata
from ipyparallel.client.map import Map
from ipyparallel.serialize import deserialize_object
from ipyparallel.serialize.canning import uncan, uncan_sequence
from ipyparallel.serialize.serialize import MAX_ITEMS

from ..compat.ipp import MapResultSeam, ResultSeam
from ..wire import protocol as P
from ..wire.bundles import SlicesEach
from ..wire.naming import parse_date
from ..wire.reduction import ReduceError
from .calls import FAILED, Call, in_table, reply_of
from .display.grouping import GroupedCompositeError, GroupedDisplay

log = logging.getLogger(__name__)
_UNSET = object()  # a result not unpacked yet


def maybe_get(ar, block):
    """``ar``, or its value if the caller blocks (as DirectView's calls return)."""
    if block and hasattr(ar, "get"):  # (an empty map's result is [] already)
        try:
            return ar.get()
        except KeyboardInterrupt:
            pass
    return ar


def engine_error(eid, uuid, message, method) -> dict:
    """Error content for an engine that cannot answer (as an engine's own:
    ``engine_info`` with ``method``, which rendering the error needs)."""
    try:
        raise error.EngineError(message)
    except error.EngineError:
        return error.wrap_exception(dict(engine_uuid=uuid, engine_id=eid, method=method))


def resolve_reduction(codec, future, reduction, raised, failed):
    """Settle a reduction's one future: the combined value, or a
    ``CompositeError`` of the engines' errors that keeps what the survivors
    combined (``.partial``)."""
    raised = [codec.unpack(r) for r in raised]
    errors = [error.unwrap_exception(r["content"]) for r in raised]
    output = getattr(future, "output", None)
    if output is not None and getattr(output, "metadata", None) is not None:
        reduction_outputs(output.metadata, reduction.outputs, raised)
    errors += [error.unwrap_exception(engine_error(*f[:3], "apply")) for f in failed]
    order = {eid: i for i, eid in enumerate(future.targets)}
    errors.sort(key=lambda e: order.get((e.engine_info or {}).get("engine_id"), -1))
    try:
        if errors:
            error.collect_exceptions(errors, "allreduce" if getattr(future, "allreduce", None) else "reduce")
        value = reduction.result()
        if getattr(future, "allreduce", None) is not None:  # the value is in the engines: counted there
            if value != len(future.targets):
                raise ReduceError(f"allreduce: {value} of {len(future.targets)} engines bound the value")
            value = None
        future.set_result(value)
    except error.CompositeError as e:
        grouped_error = GroupedCompositeError.of(e)
        grouped_error.partial = None if getattr(future, "allreduce", None) is not None else reduction.partial()
        future.set_result(grouped_error)
    except Exception as e:
        future.set_result(e)


def reduction_outputs(md, outputs: dict, raised: list[dict]) -> None:
    """A reduction's engines' outputs, in engine order, into its one ``Metadata``:
    those the tree carried beside the value, and those of engines that raised."""
    by_eid = {}
    for eid, out in outputs.items():
        with contextlib.suppress(ValueError):
            by_eid[int(eid)] = out
    for reply in raised:
        out = reply["metadata"].get(P.OUTPUTS_KEY)
        eid = (reply["content"].get("engine_info") or {}).get("engine_id")
        if isinstance(out, dict) and isinstance(eid, int):
            by_eid[eid] = out
    for eid in sorted(by_eid):
        out = by_eid[eid]
        for name in ("stdout", "stderr"):
            if isinstance(out.get(name), str) and out[name]:
                md[name] = (md[name] or "") + out[name]
        if isinstance(out.get("outputs"), list):
            md["outputs"].extend(out["outputs"])


_PLAIN = frozenset((bytes, str, int, float, complex, bool, type(None)))


def unpack_result(buffers):
    """``deserialize_object(buffers)[0]``, one Python step per result in the
    usual case of a single buffer (nothing extracted to restore)."""
    if len(buffers) != 1:
        return deserialize_object(buffers)[0]
    value = pickle.loads(buffers[0])
    return value if type(value) in _PLAIN else uncanned(value)


def uncanned(canned):
    """An unpickled result, uncanned as ipyparallel does (plain values as they are)."""
    kind = type(canned)
    if kind in _PLAIN:
        return canned
    if kind in (list, tuple, set) and len(canned) < MAX_ITEMS:
        return uncan_sequence(canned)
    if kind is dict and len(canned) < MAX_ITEMS:
        return {k: uncan(canned[k]) for k in sorted(canned)}
    return uncan(canned)


def ok_buffers(call: Call, outcome):
    """The result buffers of an ``ok`` apply reply in a host's table (read
    without parsing its JSON), or None."""
    if in_table(outcome) and outcome[3] not in outcome[1].odd and call.header["msg_type"] == "apply_request":
        return outcome[1].parts[outcome[3]]
    return None


def outcome_result(client, call: Call, i: int):
    """Engine ``i``'s result, as ipyparallel files it: a value, an
    ``ExecuteReply``, or an exception object."""
    o = call.outcomes[i]
    if o[0] == FAILED:
        method = call.header["msg_type"].split("_")[0]  # apply or execute
        return client._remote_error(engine_error(o[1], o[2], o[3], method))
    buffers = ok_buffers(call, o)
    if buffers is not None:  # the usual case: no JSON read
        return unpack_result(buffers)
    reply = reply_of(o)
    content = reply["content"]
    status = content.get("status")
    if status == "ok":
        if reply["header"].get("msg_type") == "execute_reply":
            return ExecuteReply(call.vids[i], content, outcome_metadata(client, call, i))
        return unpack_result(reply["buffers"])
    if status == "aborted":
        return error.TaskAborted(call.vids[i])
    return client._remote_error(content)


def engine_result(client, call: Call, i: int):
    """Engine ``i``'s result, unpacked once (``call.results``)."""
    if call.results is None:
        call.results = [_UNSET] * len(call.uuids)
    result = call.results[i]
    if result is _UNSET:
        try:
            result = outcome_result(client, call, i)
        except Exception as e:  # one engine's bad reply fails that engine only
            result = _unhandled(call, i, e)
        call.results[i] = result
    return result


def call_results(client, call: Call) -> list:
    """Every engine's result: the usual ones (an ``ok`` apply reply in a
    host's table) unpacked in one pass, the rest one by one."""
    if call.results is None:
        call.results = results = [_UNSET] * len(call.uuids)
        if call.header["msg_type"] == "apply_request":
            _unpack_tables(call, results)
    for i in [i for i, r in enumerate(call.results) if r is _UNSET]:
        engine_result(client, call, i)
    return list(call.results)


def _unpack_tables(call: Call, results: list) -> None:
    """The ``ok`` replies in hosts' tables, unpacked as ``unpack_result`` does,
    with the call's kind checked once (``ok_buffers`` checks it per engine),
    and a table's slices read straight from its joined frame: outcomes of one
    host come one after another, so its table is looked at once per run."""
    loads, plain, table = pickle.loads, _PLAIN, None
    for i, o in enumerate(call.outcomes):
        if o is None or len(o) != 4 or o[0] != "reply":
            continue
        if o[1] is not table:
            table = o[1]
            odd, parts = table.odd, table.parts
            joined, ends = (parts.joined, parts.ends) if type(parts) is SlicesEach and parts.per == 1 else (None, None)
        k = o[3]
        if k in odd:
            continue
        try:
            if joined is None:
                results[i] = unpack_result(parts[k])
                continue
            value = loads(joined[ends[k] : ends[k + 1]])
            results[i] = value if type(value) in plain else uncanned(value)
        except Exception as e:
            results[i] = _unhandled(call, i, e)


def _unhandled(call: Call, i: int, e: Exception) -> Exception:
    log.error("Could not handle engine %s's reply to %s", call.eids[i], call.msg_id, exc_info=e)
    return RuntimeError(f"engine {call.eids[i]}: its reply could not be handled: {e!r}")


# Metadata are made on first read by any thread: the I/O thread (an output
# arriving, a reply filed) and the user's (``ar.stdout``, ``wait_for_output``).
# Made twice, one engine's output went into an object the other thread then
# replaced: its stdout was lost (the chaos soak's executes with empty stdout).
_MADE = Lock()


def outcome_metadata(client, call: Call, i: int) -> Metadata:
    """Engine ``i``'s Metadata, made once on first read (by any thread) and
    filled once its outcome is in."""
    mds = call.mds
    md = mds[i] if mds is not None else None
    if md is not None:
        return md
    with _MADE:
        if call.mds is None:
            call.mds = [None] * len(call.uuids)
        md = call.mds[i]
        if md is None:
            md = Metadata(
                msg_id=call.vids[i],
                submitted=call.header.get("date"),
                engine_uuid=call.uuids[i],
                engine_id=call.eids[i],
            )
            _fill(client, call, i, md)
            call.mds[i] = md
    return md


def fill_metadata(client, call: Call, i: int):
    """Copy engine ``i``'s outcome into its Metadata, if both exist (once)."""
    if call.mds is None or call.mds[i] is None:
        return
    with _MADE:
        _fill(client, call, i, call.mds[i])


def _fill(client, call: Call, i: int, md):
    o = call.outcomes[i]
    if o is None or md.get("received") is not None:
        return
    md["received"] = call.received[i]
    if o[0] == FAILED:
        return
    reply = reply_of(o)
    meta, content = reply["metadata"], reply["content"]
    # as ipyparallel's client extracts reply metadata (dict.update: its extra keys too)
    dict.update(
        md,
        status=content.get("status"),
        follow=meta.get("follow", []),
        after=meta.get("after", []),
        label=meta.get("label"),
        is_broadcast=True,
        is_coalescing=False,
        completed=reply["header"].get("date"),
        started=parse_date(meta.get("started")),
    )
    outputs = meta.get(P.OUTPUTS_KEY)
    if outputs:  # our engine: what IOPub would have brought came in the reply
        for name in ("stdout", "stderr"):
            if outputs.get(name):
                md[name] = (md[name] or "") + outputs[name]
        md["outputs"].extend(outputs.get("outputs") or ())
    if content.get("status") == "error" and md["error"] is None:
        md["error"] = client._remote_error(content)


def _weakly(method):
    """A call's done callback that does not keep its AsyncResult alive: the
    client keeps its recent calls (``Calls.recent``), and a Future keeps its
    callbacks, so a strong one would hold every AsyncResult, and its value
    (a gathered array), for the next ``broadcast_results_kept`` calls."""
    ref, func = weakref.ref(method.__self__), method.__func__

    def callback(future):
        ar = ref()
        if ar is not None:
            func(ar, future)

    return callback


class _Bulk:
    """An AsyncResult over one ``Call``: two futures per call, not two per engine."""

    def _bulk_init(self, client, call: Call, fname, targets, single, owner, return_exceptions=False, chunk_sizes=None):
        Future.__init__(self)
        self._call, self._rc, self._function_name = call, client, fname
        self._target_ids, self.owner = targets, owner
        self._single, self._keep_exceptions = single, return_exceptions
        self._map_chunk_sizes = chunk_sizes or {}
        self.msg_ids = call.vids
        self._is_ready, self._ready_flag = False, Event()
        self._is_output_ready, self._output_flag = False, Event()
        self._sent_flag, self._succeeded = Event(), None
        call.tracker.add_done_callback(_weakly(self._on_sent))
        call.future.add_done_callback(_weakly(self._on_result))
        call.output.add_done_callback(_weakly(self._on_output))
        self.add_done_callback(_weakly(self._on_ready))  # (a strong one: a cycle, freed only by a collection)

    def _engine_futures(self) -> list:
        """Per-engine futures, made on first use (iteration in flight, ``split``, ...)."""
        return self._rc._children_of(self._call)

    def _engine_metadata(self) -> list:
        return [outcome_metadata(self._rc, self._call, i) for i in range(len(self._call.uuids))]

    @property
    def _broadcast_id(self) -> str:
        return self._call.msg_id

    def _on_output(self, f=None):
        self._is_output_ready = True
        self._output_flag.set()

    def _on_ready(self, f):
        self._is_ready = True
        self._ready_flag.set()

    @property
    def progress(self) -> int:
        call = self._call
        if not self._map_chunk_sizes:
            return len(call.uuids) - call.left
        return sum(self._map_chunk_sizes.get(v, 1) for v, o in zip(call.vids, call.outcomes) if o is not None)


class _Survivors:
    """A ``CompositeError`` from ``get()`` keeps every engine's outcome in
    ``.results``: the survivors' results, with the errors in place. Its
    message and tracebacks show each distinct error once (``grouping``)."""

    def _raise_errors(self, results):
        try:
            return super()._raise_errors(results)
        except error.CompositeError as e:
            grouped_error = GroupedCompositeError.of(e)
            grouped_error.results = list(results)
            raise grouped_error from None


class _Traced:
    @property
    def trace(self) -> list:
        """When this call passed the client, each relay node and each engine
        (a view with ``trace=True``; see ``ipyparallel_broadcast.client.display.trace``).
        Waits for the call to finish."""
        self.wait()
        return self._rc.broadcast_trace(self._broadcast_id)


class TreeAsyncResult(_Survivors, _Traced, GroupedDisplay, _Bulk, ResultSeam):
    """DirectView's AsyncResult for a broadcast: over its ``Call``."""

    def __init__(self, client, call: Call, fname="unknown", targets=None, owner=False, single=False, **kwargs):
        self._bulk_init(client, call, fname, targets, single, owner, **kwargs)


class ReducedAsyncResult(_Survivors, _Traced, GroupedDisplay, ResultSeam):
    """A reduction's AsyncResult: ipyparallel's, over the one future of the
    combined value."""

    @property
    def _broadcast_id(self):
        return getattr(self._engine_futures()[0], "broadcast_id", None)


class TreeAsyncMapResult(_Survivors, _Traced, GroupedDisplay, _Bulk, MapResultSeam):
    """AsyncMapResult over a call: chunks joined by ``mapObject``, by the
    thread that first reads the result (``Unjoined``)."""

    def __init__(
        self, client, call: Call, mapObject, fname="", ordered=True, return_exceptions=False, chunk_sizes=None
    ):
        self._map_object, self.ordered = mapObject, ordered
        self._bulk_init(client, call, fname, None, False, False, return_exceptions, chunk_sizes)

    def _joined(self, parts):
        """ipyparallel's join; while the call completes (on the client's I/O
        thread), put off until the result is read."""
        return self._join(parts) if self.done() else Unjoined(parts, self._join)

    def _join(self, parts):
        """Big arrays joined into the client's warm buffers (``shared.WarmBuffers``),
        anything else by ipyparallel's ``mapObject``."""
        mapper, shared = type(self._map_object), getattr(self._rc, "_shared", None)
        if shared is not None and mapper.joinPartitions is Map.joinPartitions and mapper.concatenate is Map.concatenate:
            joined = shared.buffers.concatenate(parts, shared.threshold)
            if joined is not None:
                return joined
        return super()._joined(parts)

    def result(self, timeout=None):
        value = super().result(timeout)
        return value.value() if type(value) is Unjoined else value


class Unjoined:
    """A map's or gather's parts, joined once, when first read. The join copies
    every part into one new object: on the client's I/O thread it would hold up
    every other reply meanwhile, and there each new big array landed in fresh
    pages (measured: 15 ms of page faults for 8 MB on a 2-core VM, against
    1 ms on the thread that reads the result)."""

    __slots__ = ("parts", "join", "joined", "lock")

    def __init__(self, parts, join):
        self.parts, self.join, self.joined, self.lock = parts, join, None, Lock()

    def size(self, measure) -> int:
        """``measure`` of the joined value, as the sum over the parts if not joined yet."""
        with self.lock:
            return measure(self.joined) if self.join is None else sum(measure(p) for p in self.parts)

    def value(self):
        with self.lock:
            if self.join is not None:
                self.joined, self.join, self.parts = self.join(self.parts), None, None
            return self.joined
