"""The seam to IPython Parallel: every private member of it that this package
uses is named here, once, with why. Nowhere else in the package does a name
of ipyparallel's that begins with ``_`` appear (``tests/test_layout.py``).

Each seam class is ipyparallel's class with its private members under names
of ours, in two kinds:

- **state** we read or replace (``STATE``): a property of ours over
  ipyparallel's attribute (``client._engine_table`` is ``client._engines``);
- **hooks** ipyparallel calls on itself and we override (``HOOKS``): ours
  is ipyparallel's method until a subclass overrides it, and then, as the
  subclass is made, ipyparallel's name is bound to the override too
  (ipyparallel calls ``_setup_streams``, which is our Client's
  ``_open_streams``; that ends with ``super()._open_streams()``, which is
  ipyparallel's). No call goes through this module at run time. Methods of
  ipyparallel's that we only call are aliases (``CALLS``).

When IPython Parallel renames one, this module changes and nothing else;
``tests/test_layout.py`` checks that each still exists upstream. The seam
classes are made when first imported (``ClientSeam``, ``ViewSeam``,
``ResultSeam``, ``MapResultSeam``, ``EngineSeam``, ``RecordsSeam``,
``TaskSchedulerSeam``, ``SQLiteSeam``), so a
client does not import the engine's or the hub's modules, and a relay, which
imports none of them, no ipyparallel at all.

Checked against IPython Parallel 9.2.0 (the suite) and 9.1.0 (the oldest that
``pyproject.toml`` allows: ``.ci/wheel`` runs the smoke test on it).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

# where each seam's upstream class lives
BASES = {
    "ClientSeam": "ipyparallel.client.client:Client",
    "ViewSeam": "ipyparallel.client.view:DirectView",
    "ResultSeam": "ipyparallel.client.asyncresult:AsyncResult",
    "MapResultSeam": "ipyparallel.client.asyncresult:AsyncMapResult",
    "EngineSeam": "ipyparallel.engine.app:IPEngine",
    "RecordsSeam": "ipyparallel.controller.dictdb:DictDB",
    "TaskSchedulerSeam": "ipyparallel.controller.task_scheduler:TaskScheduler",
    "SQLiteSeam": "ipyparallel.controller.sqlitedb:SQLiteDB",
}

# seam: {ipyparallel's attribute: (ours, why)}
STATE = {
    "ClientSeam": {
        "_engines": ("_engine_table", "engine ids to uuids (a ReverseDict), to route outputs and fail requests"),
        "_ids": ("_engine_ids", "all targets, as ipyparallel resolves 'all'"),
        "_futures": ("_reply_futures", "one future per call, which Client.wait() finds"),
        "_output_futures": ("_iopub_futures", "per-engine output futures made on demand"),
        "_outstanding_dict": ("_outstanding_by_engine", "per-engine outstanding sets read from the calls"),
        "_config": ("_connection_info", "the connection file's broadcast tree, read once"),
        "_closed": ("_is_closed", "no broadcast sent by a closed client"),
        "_io_loop": ("_loop", "work handed to the client's I/O thread"),
        "_io_thread": ("_loop_thread", "results unpacked in place when already on the I/O thread"),
        "_iopub_socket": ("_iopub_sock", "the IOPub hello subscription"),
        "_control_socket": ("_control_sock", "a kernel_info probe when the controller is stock"),
        "_broadcast_stream": ("_root_stream", "the broadcast socket (our RootSocket): bundles in, one request out"),
        "_mux_stream": ("_direct_stream", "DirectView's socket, for per-engine pushes"),
        "_task_stream": ("_balanced_stream", "LoadBalancedView's socket: its requests fail if the task queue dies"),
        "_control_stream": ("_control_channel", "control requests fail if the control queue dies"),
        "_context": ("_zmq_context", "the controller's notices are read in the client's context"),
        "_ssh": ("_tunneled", "a client through an ssh tunnel does not read the controller's notices"),
        "_notification_handlers": ("_notification_table", "registrations read through our roster (client.roster)"),
        "_notification_socket": ("_notification_sock", "the roster's hello subscription"),
        "_registration_callbacks": ("_registered_callbacks", "called per engine of a batch filed in one update"),
        "_connected": ("_is_connected", "a connection request lost with a controller that died is asked again"),
        "_query_socket": ("_query_sock", "the same: its reply awaited while the controller restarts"),
    },
    "ResultSeam": {
        "_client": ("_rc", "set as ipyparallel's __init__ does, over one call"),
        "_fname": ("_function_name", "the same"),
        "_targets": ("_target_ids", "the same; read by the chaos checker"),
        "_single_result": ("_single", "the same; read by grouped displays"),
        "_return_exceptions": ("_keep_exceptions", "the same"),
        "_ready": ("_is_ready", "the same"),
        "_ready_event": ("_ready_flag", "the same"),
        "_output_ready": ("_is_output_ready", "the same"),
        "_output_event": ("_output_flag", "the same"),
        "_sent_event": ("_sent_flag", "the same"),
        "_success": ("_succeeded", "the same"),
        "_scatter_lengths": ("_part_lengths", "a tree scatter's parts, which gather reads back"),
        "_chunk_sizes": ("_map_chunk_sizes", "a map's chunks, for len() and progress"),
    },
    "MapResultSeam": {
        "_mapObject": ("_map_object", "chunks joined as ipyparallel joins them"),
    },
    "EngineSeam": {
        "_hb_listener": ("_heart_stream", "heartbeat pings drained per period, not woken per ping"),
        "_hb_last_pinged": ("_heart_last_ping", "the same"),
    },
    "RecordsSeam": {
        "_records": ("_store", "the in-memory store culled by size and count together"),
        "_culled_ids": ("_culled", "culled ids remembered for a bounded while, not for good"),
    },
    "SQLiteSeam": {
        "_db": ("_connection", "the table's columns read, to tell whether a restored hub may reuse it"),
        "_keys": ("_columns", "the same"),
        "_types": ("_column_types", "the same"),
    },
}

# seam: {ipyparallel's method, which it calls on itself: (ours, why we override it)}
HOOKS = {
    "ClientSeam": {
        "_build_targets": ("_targets_of", "broadcast targets resolve without a per-engine list"),
        "_send": ("_send_message", "a request to an engine gone meanwhile fails, not hangs"),
        "_extract_metadata": ("_metadata_of", "engine start times parsed by the fast parser"),
        "_setup_streams": ("_open_streams", "every stream read by a contained handler"),
        "_asyncresult_from_jobs": ("_result_of_jobs", "a broadcast's per-engine ids found by call"),
        "_connect": ("_connect_to_hub", "a connection request lost with a controller that died is asked again"),
    },
    "ViewSeam": {
        "_really_apply": ("_apply_call", "an apply becomes one broadcast"),
        "_sync_results": ("_settle_outstanding", "one pass over a call's per-engine ids, not three set copies"),
    },
    "ResultSeam": {
        "_handle_sent": ("_on_sent", "the call's tracker, not one per engine"),
        "_resolve_result": ("_on_result", "the call's future, not two per engine"),
        "_resolve_output": ("_on_output", "the call's output future"),
        "_finalize_result": ("_on_ready", "ready once the call is"),
        "_collect_exceptions": ("_raise_errors", "errors that keep the survivors' results"),
    },
    "MapResultSeam": {
        "_reconstruct_result": ("_joined", "the join (a copy of every part) runs on the thread that reads the result"),
    },
    "EngineSeam": {
        "_signal_stop": ("_on_stop_signal", "an engine stopped by SIGTERM exits 0"),
        "_hb_monitor": ("_check_heart", "heartbeat pings drained per period, not woken per ping"),
    },
    "TaskSchedulerSeam": {
        "_unregister_engine": ("_remove_engine", "an engine gone while a restarted scheduler waits is not scheduled"),
        "_register_engine": ("_add_engine", "an engine announced twice (the roster's replay) is scheduled once"),
    },
    "SQLiteSeam": {
        "_check_table": ("_table_fits", "SQLite gives a key's type in capitals: a restored hub made a new table"),
    },
    "RecordsSeam": {
        "_add_bytes": ("_count_bytes", "buffer bytes counted without traitlets per record"),
        "_drop_bytes": ("_uncount_bytes", "the same, as records go"),
        "_maybe_cull": ("_cull_if_over", "oldest first by insertion, not a sort by date per cull"),
        "_cull_oldest": ("_cull_first", "never more than record_limit records"),
    },
}

# seam: {ipyparallel's method we call (never override): (ours, why)}
CALLS = {
    "ClientSeam": {
        "_unwrap_exception": ("_remote_error", "an engine's error made as ipyparallel makes it"),
        "_handle_apply_reply": ("_file_apply_reply", "a vanished engine's request failed as its death is"),
        "_register_engine": ("_file_registration", "a roster's change filed as ipyparallel files a notification"),
        "_unregister_engine": ("_file_unregistration", "the same, for an engine gone"),
        "_update_engines": ("_file_engines", "a host's engines filed in one update: ipyparallel sorts its ids at each"),
    },
    "ResultSeam": {
        "_display_stream": ("_print_stream", "grouped outputs shown as ipyparallel shows one"),
        "_republish_displaypub": ("_show_rich", "the same, for rich outputs"),
    },
}

# attributes another of ipyparallel's classes sets on the seam's
SET_BY = {"_scatter_lengths": "ipyparallel.client.view:DirectView"}

# per-engine parts that ipyparallel's AsyncResult keeps as lists, which ours
# makes when read (properties over ``_engine_futures`` / ``_engine_metadata``)
MADE_WHEN_READ = {
    "_children": ("_engine_futures", "per-engine futures made on first use"),
    "_metadata": ("_engine_metadata", "per-engine metadata made when read"),
}


def _upstream(where: str):
    module, _, name = where.partition(":")
    return getattr(importlib.import_module(module), name)


def _state(upstream: str, doc: str) -> property:
    def get(self):
        return getattr(self, upstream)

    def put(self, value):
        setattr(self, upstream, value)

    return property(get, put, doc=doc)


def _made_when_read(upstream: str, ours: str, doc: str) -> tuple:
    """A property that asks ``ours()``, and ``ours`` that, unless overridden,
    reads what ipyparallel's own ``__init__`` stored (a reduction's result)."""

    def put(self, value):
        self.__dict__[upstream] = value

    return property(lambda self: getattr(self, ours)(), put, doc=doc), lambda self: self.__dict__[upstream]


def _seam(name: str) -> type:
    base = _upstream(BASES[name])
    like = "ResultSeam" if name == "MapResultSeam" else name  # AsyncMapResult is an AsyncResult
    members: dict = {"__module__": __name__, "__doc__": f"``{BASES[name]}``, its private members by our names."}
    for upstream, (ours, why) in {**STATE.get(like, {}), **STATE.get(name, {})}.items():
        members[ours] = _state(upstream, why)
    hooks = {**HOOKS.get(like, {}), **HOOKS.get(name, {})}
    for upstream, (ours, _) in hooks.items():
        members[ours] = getattr(base, upstream)
    for upstream, (ours, _) in CALLS.get(like, {}).items():
        members[ours] = getattr(base, upstream)
    if like == "ResultSeam":
        for upstream, (ours, why) in MADE_WHEN_READ.items():
            members[upstream], members[ours] = _made_when_read(upstream, ours, why)

    def __init_subclass__(cls, **kwargs):
        """ipyparallel's name for each hook is the subclass's override of ours
        (unless the subclass overrides ipyparallel's name itself)."""
        super(seam, cls).__init_subclass__(**kwargs)
        for upstream, (ours, _) in hooks.items():
            if upstream not in cls.__dict__:
                setattr(cls, upstream, getattr(cls, ours))

    members["__init_subclass__"] = classmethod(__init_subclass__)
    seam = type(name, (base,), members)
    return seam


def __getattr__(name: str):  # PEP 562: each seam class made on first import
    if name not in BASES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    seam = globals()[name] = _seam(name)
    return seam


# --------------------------------------------------------------- functions
def upstream_iopub(client, msg: dict):
    """``Client._dispatch_iopub`` below its ``@unpack_message``: ipyparallel's
    filing of a parsed IOPub message (stdout, display data, status) into the
    per-engine metadata; ours parses and routes first."""
    seam = globals().get("ClientSeam") or __getattr__("ClientSeam")
    return seam.__mro__[1]._dispatch_iopub.__wrapped__(client, msg)  # the class ours was made on


def client_streams(client) -> dict:
    """ipyparallel's client streams by what they carry: ``{what: (stream,
    ipyparallel's handler of its raw frames)}``, for ours to read them."""
    return {
        "query": (client._query_stream, client._dispatch_single_reply),
        "control": (client._control_stream, client._dispatch_single_reply),
        "mux": (client._mux_stream, client._dispatch_reply),
        "task": (client._task_stream, client._dispatch_reply),
        "IOPub": (client._iopub_stream, client._dispatch_iopub),
        "notification": (client._notification_stream, client._dispatch_notification),
    }


def stock_reply(client, frames):
    """``Client._dispatch_reply``: a reply ipyparallel files itself (a stock
    controller's broadcast reply, DirectView's replies)."""
    return client._dispatch_reply(frames)


def raw_text(text: str) -> None:
    """``ipyparallel.client.asyncresult._raw_text``: a label shown as plain
    text above rich outputs, as ipyparallel labels each engine's."""
    from ipyparallel.client.asyncresult import _raw_text

    _raw_text(text)


def hub_next_id(hub) -> int:
    """``Hub._idcounter``: the id the hub gives the next engine, from which the
    controller picks one that balances the leaves (``controller.app``)."""
    return hub._idcounter


def set_hub_next_id(hub, next_id: int) -> None:
    """``Hub._idcounter``: a restarted controller grants no id its engines had
    before (``controller.restore``), as ipyparallel's ``--restore`` sets it."""
    hub._idcounter = next_id


def coalesce_hub_state_file(hub, wrap: Callable[[Callable[[], None]], Callable[[], None]]) -> None:
    """``Hub._save_engine_state``: ipyparallel calls it on every registration
    and unregistration, and it rewrites the whole engine-state file; ours
    replaces it with ``wrap(its own)``: the engine journal synced once per
    burst (``controller.enginejournal``, ``controller.statefile``)."""
    hub._save_engine_state = wrap(hub._save_engine_state)


def wrap_hub_purge(hub, wrap: Callable[[Callable[[bytes], None]], Callable[[bytes], None]]) -> None:
    """``Hub._purge_stalled_registration``: the hub gives up a registration
    whose heart never beat; ours is ``wrap(its own)``, which journals the
    grant gone too (``controller.hubhooks``)."""
    hub._purge_stalled_registration = wrap(hub._purge_stalled_registration)


def save_hub_state(hub) -> None:
    """``Hub._save_engine_state``: a batch of engines registered by host is
    written once (through the coalescing wrapper, when there is one)."""
    hub._save_engine_state()


def wait_on_process(launcher) -> None:
    """``LocalProcessLauncher._start_waiting``: a launcher whose controller's keeper
    died waits on the keeper that adopted it (``launch.succession``)."""
    launcher._start_waiting()


def ar_engine_futures(ar) -> list:
    """``AsyncResult._children``: an AsyncResult's per-engine futures (tools)."""
    return ar._children


def ar_targets(ar):
    """``AsyncResult._targets``, or None (tools)."""
    return getattr(ar, "_targets", None)


def engine_push():
    """``ipyparallel.util._push``: the function DirectView's ``push`` runs on
    engines (a tree scatter runs it too, so gather and pull read the same)."""
    from ipyparallel import util

    return util._push


def engine_pull():
    """``ipyparallel.util._pull``: the function DirectView's ``pull`` runs."""
    from ipyparallel import util

    return util._pull


def engine_uuids(client) -> dict:
    """``Client._engines``: engine id -> uuid, as a plain dict (tools)."""
    return dict(client._engines)


def heart_monitor_kwargs(app) -> dict:
    """The arguments of ``IPController.heartmonitor_process`` (a ``Process``,
    which keeps them as ``_kwargs``): a dead heart monitor is started again
    with ipyparallel's own (``controller.app``)."""
    return dict(app.heartmonitor_process._kwargs)


def start_heart_monitor(cls: type, **kwargs) -> None:
    """``start_heartmonitor``, in this (child) process, with ``cls`` as its
    monitor: ``_setup_heartmonitor`` makes the module's ``HeartMonitor``."""
    from ipyparallel.controller import heartmonitor

    heartmonitor.HeartMonitor = cls
    heartmonitor.start_heartmonitor(**kwargs)


def future_without_tracker(future) -> None:
    """``MessageFuture._tracker``: an engine future that needs none."""
    future._tracker = None


# where upstream's private members are used in this module (not through the
# tables above), with why: the layout test checks they still exist
DIRECT = {
    "ipyparallel.client.client:Client._dispatch_iopub": "ours parses and routes, then files as ipyparallel does",
    "ipyparallel.client.client:Client._dispatch_reply": "mux and task replies, read by a contained handler",
    "ipyparallel.client.client:Client._dispatch_single_reply": "query and control replies, read by a contained handler",
    "ipyparallel.client.client:Client._dispatch_notification": "registrations, read by a contained handler",
    **{  # the streams ``client_streams`` hands to our contained handlers
        f"ipyparallel.client.client:Client._{kind}_stream": "read by a contained handler"
        for kind in ("query", "control", "task", "iopub", "notification")
    },
    "ipyparallel.client.futures:MessageFuture._tracker": "an engine future without a tracker it does not need",
    "ipyparallel.controller.hub:Hub._idcounter": "new engines numbered to balance the leaves; set on restore",
    "ipyparallel.controller.hub:Hub._save_engine_state": "the engine journal synced per burst, no table per engine",
    "ipyparallel.controller.hub:Hub._purge_stalled_registration": "a grant the hub gives up is journaled gone",
    "ipyparallel.client.asyncresult:_raw_text": "grouped outputs labelled as ipyparallel labels one engine's",
    "ipyparallel.controller.heartmonitor:_setup_heartmonitor": "makes the module's HeartMonitor: ours, in its process",
    "ipyparallel.util:_push": "a tree scatter runs on engines what DirectView's push does",
    "ipyparallel.util:_pull": "a tree gather runs on engines what DirectView's pull does",
}


def uses() -> dict[str, str]:
    """Every private member of ipyparallel this package uses: where -> why."""
    found = dict(DIRECT)
    for table in (STATE, HOOKS, CALLS):
        for seam, members in table.items():
            for upstream, (_, why) in members.items():
                found[f"{SET_BY.get(upstream, BASES[seam])}.{upstream}"] = why
    for upstream, (_, why) in MADE_WHEN_READ.items():
        found[f"{BASES['ResultSeam']}.{upstream}"] = why
    return found


URL_KEYS = ("control", "task", "mux", "iopub", "notification", "registration", "broadcast")


def connection_info_of(client) -> dict:
    """``Client._config``: a connected client's connection info, which
    ipyparallel keeps only with its ports made into urls; as a connection file
    has it again (ports), for another client (``ipb.Client(stock_client)``)."""
    info = dict(client._config)
    for key in URL_KEYS:
        if isinstance(info.get(key), str):
            info[key] = int(info[key].rsplit(":", 1)[1])
    return info
