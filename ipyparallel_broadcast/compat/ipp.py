"""The seam to IPython Parallel's private members used below the process
roles (by ``wire``): each is imported here, when first used, with why.

Importing ``ipyparallel`` runs its package ``__init__`` (IPython, tornado,
NumPy, the cluster API: about 140 ms and 25 MB), which a relay process does
not need: these imports wait until a function here is called. This module
imports nothing of this package, so every layer may use it.

The private members that our subclasses override or read (the client's in
``client/upstream.py`` and ``client/streams.py``, the engine's in
``engine/app.py``, the hub's in ``controller/``) are listed in ``OVERRIDDEN``,
and ``tests/test_layout.py`` checks that each still exists upstream, and
that every private name of ipyparallel's the package uses is listed here.

Checked against IPython Parallel 9.2.0 (the suite) and 9.1.0 (the oldest that
``pyproject.toml`` allows: ``.ci/wheel`` runs the smoke test on it).
"""

from __future__ import annotations


def parse_date(text: str):
    """``ipyparallel.util._parse_date``: the dateutil parse of a header date,
    for the formats ``datetime.fromisoformat`` refuses (``wire.naming``)."""
    from ipyparallel.util import _parse_date

    return _parse_date(text)


def restore_buffers(canned, buffers):
    """``ipyparallel.serialize.serialize._restore_buffers``: a CannedArray's
    data frames put back in place, so a reduce value is read without
    unpickling anything but the CannedArray (``wire.reduction``)."""
    from ipyparallel.serialize.serialize import _restore_buffers

    _restore_buffers(canned, buffers)


def canned_array_class():
    """``ipyparallel.serialize.canning.CannedArray`` (public; imported late, as above)."""
    from ipyparallel.serialize.canning import CannedArray

    return CannedArray


def hub_next_id(hub) -> int:
    """``Hub._idcounter``: the id the hub gives the next engine, from which the
    controller picks one that balances the leaves (``controller.app``)."""
    return hub._idcounter


# private members this package overrides or reads, and why
OVERRIDDEN = {
    "ipyparallel.client.client:Client._build_targets": "broadcast targets resolve without a per-engine list",
    "ipyparallel.client.client:Client._send": "a request to an engine gone meanwhile fails, not hangs",
    "ipyparallel.client.client:Client._extract_metadata": "engine start times parsed by the fast parser",
    "ipyparallel.client.client:Client._setup_streams": "every stream read by a contained handler",
    "ipyparallel.client.client:Client._dispatch_iopub": "a broadcast's outputs routed to each engine's part",
    "ipyparallel.client.client:Client._dispatch_reply": "mux and task replies, read by a contained handler",
    "ipyparallel.client.client:Client._dispatch_single_reply": "query and control replies, read by a contained handler",
    "ipyparallel.client.client:Client._dispatch_notification": "registrations, read by a contained handler",
    "ipyparallel.client.client:Client._handle_apply_reply": "a vanished engine's request failed as its death is",
    "ipyparallel.client.client:Client._asyncresult_from_jobs": "a broadcast's per-engine ids found by call",
    "ipyparallel.client.client:Client._unwrap_exception": "an engine's error made as ipyparallel makes it",
    "ipyparallel.client.client:Client._futures": "per-engine futures made on demand",
    "ipyparallel.client.client:Client._output_futures": "per-engine output futures made on demand",
    "ipyparallel.client.client:Client._outstanding_dict": "per-engine outstanding sets read from the calls",
    "ipyparallel.client.client:Client._engines": "engine ids to uuids, to route outputs",
    "ipyparallel.client.client:Client._ids": "all targets, as ipyparallel resolves 'all'",
    "ipyparallel.client.client:Client._config": "the connection file's broadcast tree, read once",
    "ipyparallel.client.client:Client._closed": "no broadcast sent by a closed client",
    "ipyparallel.client.client:Client._io_loop": "work handed to the client's I/O thread",
    "ipyparallel.client.client:Client._io_thread": "results unpacked in place when already on the I/O thread",
    "ipyparallel.client.client:Client._iopub_socket": "the IOPub hello subscription",
    "ipyparallel.client.client:Client._control_socket": "a kernel_info probe when the controller is stock",
    "ipyparallel.client.client:Client._query_stream": "read by a contained handler",
    "ipyparallel.client.client:Client._control_stream": "read by a contained handler",
    "ipyparallel.client.client:Client._mux_stream": "read by a contained handler",
    "ipyparallel.client.client:Client._task_stream": "read by a contained handler",
    "ipyparallel.client.client:Client._iopub_stream": "read by a contained handler",
    "ipyparallel.client.client:Client._notification_stream": "read by a contained handler",
    "ipyparallel.client.client:Client._broadcast_stream": "the broadcast socket: bundles in, one request out",
    "ipyparallel.client.view:DirectView._really_apply": "compose switches run as a plain apply",
    "ipyparallel.client.asyncresult:AsyncResult._children": "per-engine futures made on first use",
    "ipyparallel.client.asyncresult:AsyncResult._metadata": "per-engine metadata made when read",
    "ipyparallel.client.asyncresult:AsyncResult._client": "set as ipyparallel's __init__ does, over one call",
    "ipyparallel.client.asyncresult:AsyncResult._fname": "the same",
    "ipyparallel.client.asyncresult:AsyncResult._targets": "the same",
    "ipyparallel.client.asyncresult:AsyncResult._single_result": "the same",
    "ipyparallel.client.asyncresult:AsyncResult._return_exceptions": "the same",
    "ipyparallel.client.asyncresult:AsyncResult._ready": "the same",
    "ipyparallel.client.asyncresult:AsyncResult._ready_event": "the same",
    "ipyparallel.client.asyncresult:AsyncResult._output_ready": "the same",
    "ipyparallel.client.asyncresult:AsyncResult._output_event": "the same",
    "ipyparallel.client.asyncresult:AsyncResult._sent_event": "the same",
    "ipyparallel.client.asyncresult:AsyncResult._success": "the same",
    "ipyparallel.client.asyncresult:AsyncResult._handle_sent": "the call's tracker, not one per engine",
    "ipyparallel.client.asyncresult:AsyncResult._resolve_result": "the call's future, not two per engine",
    "ipyparallel.client.asyncresult:AsyncResult._resolve_output": "the call's output future",
    "ipyparallel.client.asyncresult:AsyncResult._finalize_result": "ready once the call is",
    "ipyparallel.client.asyncresult:AsyncResult._collect_exceptions": "errors that keep the survivors' results",
    "ipyparallel.client.asyncresult:AsyncMapResult._mapObject": "chunks joined as ipyparallel joins them",
    "ipyparallel.client.asyncresult:AsyncResult._display_stream": "grouped outputs shown as ipyparallel shows one",
    "ipyparallel.client.asyncresult:AsyncResult._republish_displaypub": "the same, for rich outputs",
    "ipyparallel.client.futures:MessageFuture._tracker": "an engine future without a tracker it does not need",
    "ipyparallel.engine.app:IPEngine._hb_monitor": "heartbeat pings drained per period, not woken per ping",
    "ipyparallel.engine.app:IPEngine._hb_listener": "the same",
    "ipyparallel.engine.app:IPEngine._hb_last_pinged": "the same",
    "ipyparallel.engine.app:IPEngine._signal_stop": "an engine stopped by SIGTERM exits 0",
    # controller/records.py: ipyparallel.controller.dictdb.DictDB
    "ipyparallel.controller.dictdb:DictDB._records": "the in-memory store culled by size and count together",
    "ipyparallel.controller.dictdb:DictDB._culled_ids": "culled ids remembered for a bounded while, not for good",
    "ipyparallel.controller.dictdb:DictDB._add_bytes": "buffer bytes counted without traitlets per record",
    "ipyparallel.controller.dictdb:DictDB._drop_bytes": "the same, as records go",
    "ipyparallel.controller.dictdb:DictDB._maybe_cull": "oldest first by insertion, not a sort by date per cull",
    "ipyparallel.controller.dictdb:DictDB._cull_oldest": "never more than record_limit records",
    # controller/app.py: ipyparallel.controller.hub.Hub (read through hub_next_id)
    "ipyparallel.controller.hub:Hub._idcounter": "new engines numbered to balance the leaves",
}
