"""The seam to IPython Parallel's private members used below the process
roles (by ``wire``): each is imported here, when first used, with why.

Importing ``ipyparallel`` runs its package ``__init__`` (IPython, tornado,
NumPy, the cluster API: about 140 ms and 25 MB), which a relay process does
not need: these imports wait until a function here is called. This module
imports nothing of this package, so every layer may use it.

The private members that our subclasses override or read (the client's in
``client/upstream.py`` and ``client/streams.py``, the engine's in
``engine/app.py``, the hub's in ``controller/``) are listed in ``OVERRIDDEN``,
and ``tests/test_layout.py`` checks that each still exists upstream.

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


# private members our subclasses override or read, and why
OVERRIDDEN = {
    # client/upstream.py, client/streams.py: ipyparallel.Client
    "ipyparallel.client.client:Client._build_targets": "broadcast targets resolve without a per-engine list",
    "ipyparallel.client.client:Client._send": "a request to an engine gone while sending fails, not hangs",
    "ipyparallel.client.client:Client._extract_metadata": "engine start times parsed by the fast parser",
    "ipyparallel.client.client:Client._setup_streams": "every stream read by a contained handler",
    "ipyparallel.client.client:Client._dispatch_iopub": "a broadcast's outputs routed to each engine's part",
    "ipyparallel.client.client:Client._handle_apply_reply": "a vanished engine's request failed as its death is",
    "ipyparallel.client.client:Client._asyncresult_from_jobs": "a broadcast's per-engine ids found by call",
    "ipyparallel.client.client:Client._futures": "per-engine futures made on demand",
    "ipyparallel.client.client:Client._output_futures": "per-engine output futures made on demand",
    "ipyparallel.client.client:Client._engines": "engine ids to uuids, to route outputs",
    # engine/app.py: ipyparallel.engine.app.IPEngine
    "ipyparallel.engine.app:IPEngine._hb_monitor": "heartbeat pings drained per period, not woken per ping",
    "ipyparallel.engine.app:IPEngine._signal_stop": "an engine stopped by SIGTERM exits 0",
    # controller/records.py: ipyparallel.controller.dictdb.DictDB
    "ipyparallel.controller.dictdb:DictDB._records": "the in-memory store culled by size and count together",
}
