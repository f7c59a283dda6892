"""``ipyparallel_broadcast.Client``: ipyparallel's Client plus the broadcast tree.

One ``ipb_request`` goes out per call, and one ``calls.Call`` tracks it. Replies
come back as bundles (coalesced or streamed); each engine's outcome in a
bundle is filed in one pass, results are unpacked once when the call is
complete, and per-engine futures and metadata are made only when read
(``results``). Per-engine ids ``f"{msg_id}_{uuid}"`` name each engine's part,
as DirectView's msg_ids do.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from functools import partial

import ipyparallel as ipp
import zmq
from ipyparallel.client.client import Metadata
from ipyparallel.client.futures import MessageFuture

from ..compat.ipp import connection_info_of
from ..wire import protocol as P
from ..wire.naming import BROADCAST_ID_PREFIX, TREE_KEY
from ..wire.topology import TreeShape
from .calls import Call, Calls
from .history import History
from .iopublive import IOPubLiveness
from .outstanding import Outstanding
from .paths import PathChooser
from .replies import ReplyFiling
from .roster import EngineRoster
from .settings import Settings
from .shared import SharedReplies
from .supervision import ControllerWatch
from .traces import Traces
from .treeinfo import TreeSurveys
from .trims import HeapTrims
from .upstream import CallMetadata, EngineFuture, OutstandingByEngine

log = logging.getLogger(__name__)
_SENT_ALL = Future()  # a call's "sent" when not tracked: nothing to wait for
_SENT_ALL.set_result([None])


def envelope_content(msg_id, eids, reply, each, batch, trace, reduce, allreduce, vshm) -> dict:
    """A broadcast's envelope, checked (``protocol.validate_request``): a malformed
    one raises here, before the call is numbered or waited on."""
    request = P.request_content(msg_id, eids, reply)
    if each is not None:
        request["each"] = [len(b) for b in each]
    if batch is not None:
        request["batch"] = list(batch)
    if trace:
        request["trace"] = True
    if reduce is not None:
        request["reduce"] = reduce
        if vshm is not None:
            request["vshm"] = vshm
        if allreduce is not None:
            request["allreduce"] = allreduce
    return P.validate_request(request)


class NotABroadcastController(RuntimeError):
    """The controller does not run the ipyparallel_broadcast relay tree."""


class Client(Settings):
    """An ``ipyparallel.Client`` that can broadcast through the relay tree.
    It holds its parts (``_replies``, ``_watch``, ``_iopub_liveness``,
    ``_engine_roster``, ``_tree_surveys``, ``_heap_trims``), each owning its
    state; ipyparallel's hooks below call them."""

    history = History(help="msg_ids sent, one per engine per call (a broadcast is kept as one entry)")
    outstanding = Outstanding(help="msg_ids not yet answered, one per engine per call (a broadcast is one entry)")

    def __init__(self, *args, **kwargs):
        """``ipyparallel.Client``'s arguments; or a stock ``ipyparallel.Client``
        as the first: ``rc = ipb.Client(rc)`` connects ours to the same cluster."""
        ours = set(type(self).class_trait_names()) - set(ipp.Client.class_trait_names())
        for name in [k for k in kwargs if k in ours]:  # our settings as keywords (ipyparallel's go to its Session)
            setattr(self, name, kwargs.pop(name))
        if args and isinstance(args[0], ipp.Client) and not isinstance(args[0], Client):
            stock, args = args[0], args[1:]
            args = (connection_info_of(stock),) + args
            kwargs.setdefault("cluster", getattr(stock, "cluster", None))
        # our state first: the parent connects and starts the I/O thread, and
        # a message may reach our handlers before its __init__ returns
        self._calls = Calls()  # broadcasts in flight, and the last few finished
        self._children_lock = threading.Lock()  # per-engine futures: made by any thread, settled by I/O
        self._tracking: dict[int, tuple] = {}  # id(frames) -> (frames, future, as list) until sent
        self._reductions: dict[str, MessageFuture] = {}  # msg_id -> future, until done
        self._traces = Traces()  # events of recent traced calls (see ``trace``)
        self.metadata = CallMetadata(self)
        self._outstanding_by_engine = OutstandingByEngine(self._calls)
        self._paths = PathChooser()  # shared by this client's views
        self._shared = SharedReplies(self.shared_reply_threshold, kept=self.shared_reply_kept)  # big replies by shm
        self._watch = ControllerWatch(self)  # the controller's notices and beats
        self._iopub_liveness = IOPubLiveness(self)  # nothing sent before the IOPub subscription is live
        self._engine_roster = EngineRoster(self)  # the engine table made whole
        self._tree_surveys = TreeSurveys(self)  # the tree's own state, asked of it
        self._replies = ReplyFiling(self)  # what comes back from the tree, filed and settled
        self._heap_trims = HeapTrims(self)  # see heap_trim_interval
        super().__init__(*args, **kwargs)
        self._engine_roster.wait()
        self._iopub_liveness.wait()
        self._calls.kept, self._calls.kept_outcomes = self.broadcast_results_kept, self.broadcast_outcomes_kept
        self.history.limit = self.history_limit

    iopub_wait = property(lambda self: self._iopub_liveness.waited, doc="Seconds the connect waited for IOPub.")

    # the tree, asked (``treeinfo``)
    broadcast_stats = TreeSurveys.asked("stats")
    broadcast_trace = TreeSurveys.asked("trace")
    broadcast_tree = TreeSurveys.asked("tree")

    # ------------------------------------------------ ipyparallel's hooks
    def _connect_to_hub(self, sshserver, ssh_kwargs, timeout):
        """ipyparallel's, asking again a controller restarted meanwhile (``supervision``)."""
        return self._watch.connect(super()._connect_to_hub, sshserver, ssh_kwargs, timeout)

    def _open_streams(self):
        """ipyparallel's streams and ours (``streams``), then each part's."""
        super()._open_streams()
        self._engine_roster.open()
        self._iopub_liveness.open()
        self._watch.open()

    def _send_message(self, socket, msg_type, *args, ident=None, **kwargs):
        """ipyparallel's (``upstream``); a request through a queue is watched until it ends."""
        future = super()._send_message(socket, msg_type, *args, ident=ident, **kwargs)
        self._watch.sent(socket, future, ident)
        return future

    def _read_iopub(self, frames):
        self._iopub_liveness.heard()
        return super()._read_iopub(frames)

    def _dispatch_broadcast(self, frames):
        """The broadcast socket's handler (``streams``): what the tree sends back."""
        return self._replies.dispatch(frames)

    def close(self, linger=None):
        """ipyparallel's; then reply segments in shared memory that no call read go."""
        super().close(self._watch.closing(linger))
        self._shared.close()

    # ----------------------------------------------------------------- views
    @property
    def tree_shape(self) -> TreeShape:
        info = self._connection_info.get(TREE_KEY)
        if not info:
            raise NotABroadcastController(
                "This controller does not run the ipyparallel_broadcast relay tree "
                "(its connection file has no 'broadcast_tree'). Start the cluster with "
                "`ipcluster start --controller=broadcast` or `ipyparallel_broadcast.Cluster`, "
                "or use ipyparallel's own `Client.broadcast_view` / `direct_view`."
            )
        return TreeShape(info["depth"], info["fanout"])

    def broadcast_view(self, targets="all", coalescing=True, is_coalescing=None, **kwargs):
        """A view that reaches ``targets`` with one message per call.

        ``coalescing=True``: one merged reply per call; ``False``: each engine's
        reply is streamed back as it arrives. ``is_coalescing`` is accepted as
        ipyparallel's name for the same switch.
        """
        from .view import BroadcastView

        _ = self.tree_shape  # fail now, with a clear message, on a stock controller
        if is_coalescing is not None:
            coalescing = is_coalescing
        if targets is None:
            targets = "all"
        if not isinstance(targets, str):  # as direct_view: an int stays one engine
            eids = self._targets_of(targets)[1]
            targets = eids[0] if isinstance(targets, int) else eids
        return BroadcastView(
            client=self,
            socket=self._root_stream,
            targets=targets,
            coalescing=coalescing,
            **kwargs,
        )

    # ------------------------------------------------------------------ send
    def resolve_targets(self, targets):
        """``(uuids, engine ids)`` of ``targets`` (an int, a list, a slice, "all")."""
        return self._uuids_of(targets)

    def send_broadcast(
        self,
        msg_type,
        eids,
        uuids,
        content=None,
        buffers=(),
        metadata=None,
        reply=P.COALESCE,
        track=False,
        each=None,
        batch=None,
        reduce=None,
        trace=False,
        allreduce=None,
    ):
        """Sign one request for ``eids`` and send it to the root of the tree.

        ``each``: every target's own buffers, in target order, sent after the
        shared ``buffers``. ``batch``: ``[count, interval]`` for streaming.
        ``trace``: record the call's path (``broadcast_trace``).
        Returns the ``calls.Call`` (its ``future`` gives every engine's result,
        in target order); with ``reduce`` (an op of ``reduction.OPS``), the one
        future of the combined value; with ``allreduce`` too (a name), that value
        is bound to the name in every target engine instead, and the future gives None.
        """
        if self._is_closed:
            raise RuntimeError("Client cannot be used after its sockets have been closed")
        if len(set(eids)) != len(eids):
            raise ValueError(f"targets name an engine more than once: {eids}")
        if not eids:  # ipyparallel's AsyncResult needs at least one engine
            raise ValueError("a broadcast needs at least one target engine")
        md = dict(metadata or {}, is_broadcast=True)
        shared = self._shared.spec if reduce is None and self._codec.json else None
        if shared is not None:  # (reductions' values are combined by the relays: they need the bytes)
            md[P.SHM_REPLY_KEY] = shared
        if trace:
            md[P.TRACE_KEY] = True
        header = self.session.msg_header(msg_type)
        header["msg_id"] = BROADCAST_ID_PREFIX + header["msg_id"]
        msg_id = header["msg_id"]
        vshm = self._shared.spec if reduce is not None else None  # a big value combined here comes by a segment's name
        request = envelope_content(msg_id, eids, reply, each, batch, trace, reduce, allreduce, vshm)  # (may raise)
        md[P.SEQ_KEY], md[P.OWED_KEY] = self._root_watch.copies.number(msg_id)  # (engines keep replies)
        try:  # (a call numbered but never sent would hold the engines' acknowledgement back for good)
            inner = self.session.msg(msg_type, content=content or {}, metadata=md, header=header)
            frames = self.session.serialize(inner)[1:] + list(buffers)
            frames += [b for own in each or () for b in own]
            if trace:
                self._traces.start(msg_id)
            if reduce is not None:
                sent = self._reduce_future(msg_id, inner["header"], track)
                sent.targets, sent.op, sent.broadcast_id = list(eids), reduce, msg_id
                sent.allreduce = allreduce
                tracker, as_list = sent.tracker, False
            else:
                sent = self._start_call(msg_id, inner["header"], eids, uuids, track)
                sent.stream = reply == P.STREAM
                tracker, as_list = sent.tracker, True
            envelope = self.session.msg(P.REQUEST, content=request)
            to_send = self.session.serialize(envelope) + frames
            biggest = max((memoryview(f).nbytes for f in frames[5:]), default=0)
            copy = biggest < self.session.copy_threshold
            self._root_watch.copies.keep(msg_id, request, frames, copy)  # to go again if lost
        except BaseException:
            self._root_watch.copies.done(msg_id)
            raise
        if track:
            self._tracking[id(to_send)] = (to_send, tracker, as_list)
        # on the I/O thread, through the RootSocket: a send behind its back can
        # eat the socket's edge-triggered read event, and replies would wait unread
        send = self._root_stream.send_multipart
        if trace:
            send = partial(self._send_traced, msg_id, send)
        self._loop.add_callback(self._replies.to_root, msg_id, send, to_send, copy=copy, track=track)
        return sent

    def _send_traced(self, msg_id, send, *args, **kwargs):
        self._traces.add(msg_id, "request out", time.time())
        send(*args, **kwargs)

    def _broadcast_sent(self, msg, status):
        """The broadcast socket's send callback: hand the zmq MessageTracker to the call."""
        _, tracker, as_list = self._tracking.pop(id(msg), (None, None, False))
        if tracker is not None and not tracker.done():
            status = status if isinstance(status, zmq.MessageTracker) else None
            tracker.set_result([status] if as_list else status)

    def _start_call(self, msg_id, header, eids, uuids, track) -> Call:
        """A call's state: one result future and one output future for all engines."""
        call = Call(msg_id, header, eids, uuids)
        call.future, call.output = EngineFuture(msg_id, header), EngineFuture(msg_id, header)
        call.future.output, call.output.metadata = call.output, Metadata(msg_id=msg_id)
        call.tracker = Future() if track else _SENT_ALL
        self._reply_futures[msg_id] = call.future  # Client.wait() finds one future per call
        self.outstanding.add(msg_id)
        self.outstanding.add_call(msg_id, call.uuids)  # and each engine's part, as DirectView's
        self.history.add_call(msg_id, call.uuids)
        self._calls.start(call)
        return call

    def _reduce_future(self, msg_id, header, track) -> MessageFuture:
        """One future for a reduction's combined value."""
        future = EngineFuture(msg_id, header, track=track)
        future.output = EngineFuture(msg_id, header)
        future.output.metadata = self.metadata[msg_id]
        self._reductions[msg_id] = self._reply_futures[msg_id] = future
        self.outstanding.add(msg_id)
        self.history.append(msg_id)

        def done(f):  # (f, not the future closed over: that would be a cycle, freed late)
            self._root_watch.done(msg_id)
            if msg_id in self._traces:
                self._traces.add(msg_id, "done", time.time())
            self.outstanding.discard(msg_id)
            self._reply_futures.pop(msg_id, None)
            self.metadata.pop(msg_id, None)
            f.output.set_result(None)

        future.add_done_callback(done)
        return future
