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
from collections import defaultdict
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FuturesTimeout
from functools import partial
from typing import Dict, List

import zmq
from tornado.ioloop import PeriodicCallback
from traitlets import Float, Integer

import ipyparallel as ipp
from ipyparallel import error, util
from ipyparallel.client.client import Metadata
from ipyparallel.client.futures import MessageFuture

from . import protocol as P
from .calls import FAILED, Call, Calls
from .protocol import parse_date
from .guard import contained, guarded_callback
from .reduction import Reduction
from .results import engine_error, fill_metadata, outcome_metadata, outcome_result
from .rootwatch import RootWatch
from .topology import TreeShape, render
from .trace import Traces, merge

log = logging.getLogger(__name__)
# ipyparallel's IOPub handling of a parsed message, taken once: a rebound
# ``ipyparallel.Client`` (a user's subclass, a mock) must not change it
_UPSTREAM_IOPUB = ipp.Client._dispatch_iopub.__wrapped__
_SENT = Future()
_SENT.set_result(None)
_SENT_ALL = Future()  # a call's "sent" when not tracked: nothing to wait for
_SENT_ALL.set_result([None])
_UNSET = object()


class EngineFuture(MessageFuture):
    """A MessageFuture without the Event and tracker Future it does not need
    (made only for a reduction, or for engines someone waits on one by one)."""

    def __init__(self, msg_id, header=None, *, track=False):
        Future.__init__(self)
        self.msg_id = msg_id
        self.header = header
        self.track = track
        self._tracker = None
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


class NotABroadcastController(RuntimeError):
    """The controller does not run the ipyparallel_broadcast relay tree."""


class TreeLayout:
    """The tree in use: which leaf serves which engines, and the host relays
    (``hosts``: ``{label: (leaf index, engine ids)}``) with theirs."""

    def __init__(self, shape: TreeShape, engine_ids, hosts=None):
        self.shape = shape
        self.depth, self.fanout = shape.depth, shape.fanout
        self.hosts = dict(hosts or {})
        hosted = {e for _, eids in self.hosts.values() for e in eids}
        self.leaves = {
            shape.leaf_index(path): eids
            for path, eids in shape.layout(e for e in engine_ids if e not in hosted).items()
        }
        self._text = render(shape, engine_ids, self.hosts)

    def __repr__(self):
        return self._text


class Client(ipp.Client):
    """An ``ipyparallel.Client`` that can broadcast through the relay tree."""

    broadcast_results_kept = Integer(
        16, config=True,
        help="How many recent broadcast calls' results get_result() and %pxresult can recall.",
    )

    root_ping_interval = Float(
        0.5, config=True,
        help="Seconds between pings to the root about requests in flight (a root that "
        "restarted has lost them: they fail). No pings while nothing is in flight.",
    )
    root_timeout = Float(10.0, config=True, help="A root silent this long loses what is in flight.")

    def __init__(self, *args, **kwargs):
        # our state first: the parent connects and starts the I/O thread, and
        # a message may reach our handlers before its __init__ returns
        self._calls = Calls()  # broadcasts in flight, and the last few finished
        self._children_lock = threading.Lock()  # per-engine futures: made by any thread, settled by I/O
        self._tracking: Dict[int, tuple] = {}  # id(frames) -> (frames, future, as list) until sent
        self._reductions: Dict[str, MessageFuture] = {}  # msg_id -> future, until done
        self._replies_received = 0  # messages from the tree (tests count them)
        self._surveys: Dict[str, Future] = {}  # stats msg_id -> future of the node list
        self._traces = Traces()  # events of recent traced calls (see ``trace``)
        self.metadata = CallMetadata(self)
        super().__init__(*args, **kwargs)
        self._calls.kept = self.broadcast_results_kept

    # ----------------------------------------------------------------- views
    @property
    def tree_shape(self) -> TreeShape:
        info = self._config.get(P.TREE_KEY)
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

        self.tree_shape  # fail now, with a clear message, on a stock controller
        if is_coalescing is not None:
            coalescing = is_coalescing
        if targets is None:
            targets = "all"
        if not isinstance(targets, str):  # as direct_view: an int stays one engine
            eids = self._build_targets(targets)[1]
            targets = eids[0] if isinstance(targets, int) else eids
        return BroadcastView(
            client=self,
            socket=self._broadcast_stream,
            targets=targets,
            coalescing=coalescing,
            **kwargs,
        )

    def _build_targets(self, targets):
        """ipyparallel's, with a clear error for an engine that is not registered
        (it died or never came) instead of a bare ``KeyError``."""
        try:
            return super()._build_targets(targets)
        except KeyError as e:
            raise IndexError(
                f"Engine {e.args[0]!r} is not registered: it died or never registered "
                f"(registered engines: {self.ids})"
            ) from None

    def broadcast_trace(self, msg_id: str, timeout: float = 10) -> List[dict]:
        """The events of a traced broadcast, in time order: the client's, each
        relay node's and each engine's (see ``ipyparallel_broadcast.trace``)."""
        if msg_id not in self._traces:
            raise KeyError(f"no trace of {msg_id!r} (not traced, or no longer kept)")
        return merge(self._traces.events(msg_id), self.broadcast_stats(timeout, trace=msg_id))

    def broadcast_stats(self, timeout: float = 10, trace=None) -> List[dict]:
        """Every relay node's own state, gathered up the tree in one round trip:
        ``node``, ``pending`` (requests in flight), ``parked``, ``dropped``
        (bad messages refused), ``engines`` (leaves), ``rss``, ``pid``, ``busy``
        (seconds spent handling messages) and ``cpu`` (process CPU seconds).
        A node that cannot answer appears with an ``error``."""
        self.tree_shape  # a clear error on a stock controller
        msg = self.session.msg(P.STATS, content={} if trace is None else dict(trace=trace))
        msg_id = msg["content"]["msg_id"] = msg["header"]["msg_id"]
        self._surveys[msg_id] = survey = Future()
        self._io_loop.add_callback(self._to_root, msg_id, self._broadcast_stream.send_multipart,
                                   self.session.serialize(msg))
        try:
            return sorted(survey.result(timeout), key=lambda n: str(n.get("node")))
        finally:
            self._surveys.pop(msg_id, None)
            self._root_watch.done(msg_id)

    def broadcast_tree(self, timeout: float = 10) -> TreeLayout:
        """Depth, fan-out, the engines under each leaf, and the host relays
        under the leaves with their engines (asked of the tree itself)."""
        shape, hosts = self.tree_shape, {}
        nodes = self.broadcast_stats(timeout)
        leaf_of_host = {h: n["node"] for n in nodes for h in n.get("hosts") or ()}
        for n in nodes:
            if n.get("host") in leaf_of_host:
                path = () if leaf_of_host[n["host"]] == "root" else \
                    tuple(int(d) for d in leaf_of_host[n["host"]].split("."))
                hosts[n["host"]] = (shape.leaf_index(path), n.get("eids") or [])
        return TreeLayout(shape, self.ids, hosts)

    # ------------------------------------------------------------------ send
    def resolve_targets(self, targets):
        """``(uuids, engine ids)`` of ``targets`` (an int, a list, a slice, "all")."""
        idents, eids = self._build_targets(targets)
        return [i.decode("utf8") for i in idents], eids

    def send_broadcast(self, msg_type, eids, uuids, content=None, buffers=(),
                       metadata=None, reply=P.COALESCE, track=False, each=None,
                       batch=None, reduce=None, trace=False):
        """Sign one request for ``eids`` and send it to the root of the tree.

        ``each``: every target's own buffers, in target order, sent after the
        shared ``buffers``. ``batch``: ``[count, interval]`` for streaming.
        ``trace``: record the call's path (``broadcast_trace``).
        Returns the ``calls.Call`` (its ``future`` gives every engine's result,
        in target order); with ``reduce`` (an op of ``reduction.OPS``), the one
        future of the combined value.
        """
        if self._closed:
            raise RuntimeError("Client cannot be used after its sockets have been closed")
        if len(set(eids)) != len(eids):
            raise ValueError(f"targets name an engine more than once: {eids}")
        if not eids:  # ipyparallel's AsyncResult needs at least one engine
            raise ValueError("a broadcast needs at least one target engine")
        md = dict(metadata or {}, is_broadcast=True)
        if trace:
            md[P.TRACE_KEY] = True
        header = self.session.msg_header(msg_type)
        header["msg_id"] = P.BROADCAST_ID_PREFIX + header["msg_id"]
        inner = self.session.msg(msg_type, content=content or {}, metadata=md, header=header)
        msg_id = inner["header"]["msg_id"]
        frames = self.session.serialize(inner)[1:] + list(buffers)
        request = P.request_content(msg_id, eids, reply)
        if each is not None:
            request["each"] = [len(b) for b in each]
            frames += [b for own in each for b in own]
        if batch is not None:
            request["batch"] = list(batch)
        if trace:
            request["trace"] = True
            self._traces.start(msg_id)
        if reduce is not None:
            request["reduce"] = reduce
            sent = self._reduce_future(msg_id, inner["header"], track)
            sent.targets, sent.op, sent.broadcast_id = list(eids), reduce, msg_id
            tracker, as_list = sent.tracker, False
        else:
            sent = self._start_call(msg_id, inner["header"], eids, uuids, track)
            tracker, as_list = sent.tracker, True
        envelope = self.session.msg(P.REQUEST, content=P.validate_request(request))

        to_send = self.session.serialize(envelope) + frames
        biggest = max((memoryview(f).nbytes for f in frames[5:]), default=0)
        copy = biggest < self.session.copy_threshold
        if track:
            self._tracking[id(to_send)] = (to_send, tracker, as_list)
        # through the ZMQStream: a send behind its back can eat the socket's
        # edge-triggered read event, and replies would wait unread
        send = self._broadcast_stream.send_multipart
        if trace:
            send = partial(self._send_traced, msg_id, send)
        self._io_loop.add_callback(self._to_root, msg_id, send, to_send, copy=copy, track=track)
        return sent

    def _send_traced(self, msg_id, send, *args, **kwargs):
        self._traces.add(msg_id, "request out", time.time())
        send(*args, **kwargs)

    def _broadcast_sent(self, msg, status):
        """ZMQStream send callback: hand the zmq MessageTracker to the call."""
        _, tracker, as_list = self._tracking.pop(id(msg), (None, None, False))
        if tracker is not None and not tracker.done():
            status = status if isinstance(status, zmq.MessageTracker) else None
            tracker.set_result([status] if as_list else status)

    def _start_call(self, msg_id, header, eids, uuids, track) -> Call:
        """A call's state: one result future and one output future for all engines."""
        call = Call(msg_id, header, eids, uuids)
        call.future, call.output = Future(), Future()
        call.tracker = Future() if track else _SENT_ALL
        self._futures[msg_id] = call.future  # Client.wait() sees one entry per call
        self.outstanding.add(msg_id)
        self.history.extend(call.vids)
        self._calls.start(call)
        return call

    def _reduce_future(self, msg_id, header, track) -> MessageFuture:
        """One future for a reduction's combined value."""
        future = EngineFuture(msg_id, header, track=track)
        future.output = EngineFuture(msg_id, header)
        future.output.metadata = self.metadata[msg_id]
        self._reductions[msg_id] = self._futures[msg_id] = future
        self.outstanding.add(msg_id)
        self.history.append(msg_id)

        def done(_):
            self._root_watch.done(msg_id)
            self._traces.add(msg_id, "done", time.time())
            self.outstanding.discard(msg_id)
            self._futures.pop(msg_id, None)
            self.metadata.pop(msg_id, None)
            future.output.set_result(None)

        future.add_done_callback(done)
        return future

    # ---------------------------------------------- per-engine parts, on demand
    def _result(self, call: Call, i: int):
        """Engine ``i``'s result, unpacked once."""
        if call.results is None:
            call.results = [_UNSET] * len(call.uuids)
        result = call.results[i]
        if result is _UNSET:
            try:
                result = self._engine_result(call, i)
            except Exception as e:  # one engine's bad reply fails that engine only
                log.error("Could not handle engine %s's reply to %s", call.eids[i], call.msg_id, exc_info=True)
                result = RuntimeError(f"engine {call.eids[i]}: its reply could not be handled: {e!r}")
            call.results[i] = result
        return result

    def _engine_result(self, call: Call, i: int):
        return outcome_result(self, call, i)

    def _children_of(self, call: Call) -> list:
        """Per-engine futures of a call (made once, then settled as outcomes come)."""
        with self._children_lock:
            if call.children is not None:
                return call.children
            children = []
            for i, vid in enumerate(call.vids):
                child = EngineFuture(vid, call.header)
                child.output = EngineFuture(vid, call.header)
                child.output.metadata = outcome_metadata(self, call, i)
                child.broadcast_id = call.msg_id
                children.append(child)
                if call.future.done() or not call.done:  # live: IOPub callbacks reach it
                    self._futures.setdefault(vid, child)
                    self._output_futures.setdefault(vid, child.output)
            call.children = children
            ready = [i for i, o in enumerate(call.outcomes) if o is not None]
        self._settle_children(call, ready)
        return children

    def _settle_children(self, call: Call, indices):
        children = call.children
        for i in indices:
            child = children[i]
            if not child.done():
                child.set_result(self._result(call, i))
            o = call.outcomes[i]
            if (o[0] == FAILED or not o[2]) and not child.output.done():
                child.output.set_result(None)

    # --------------------------------------------------------- call progress
    def _settled(self, call: Call, indices):
        """Engines' outcomes were filed: update what exists, finish what is done."""
        if call.mds is not None:
            for i in indices:
                fill_metadata(self, call, i)
        if call.msg_id in self._traces:
            for i in indices:
                if call.outcomes[i][0] == "reply":
                    self._traces.add_engine(call.msg_id, call.eids[i], call.outcomes[i][1])
        with self._children_lock:
            made = call.children is not None
        if made:
            self._settle_children(call, indices)
        if call.done and not call.future.done():
            self._root_watch.done(call.msg_id)
            self.outstanding.discard(call.msg_id)
            call.future.set_result([self._result(call, i) for i in range(len(call.uuids))])
        if call.outputs_done and not call.output.done():
            self._call_finished(call)

    def _call_finished(self, call: Call):
        """Results and outputs are all in: the call leaves the live table."""
        self._traces.add(call.msg_id, "done", time.time())
        self._calls.finish(call)
        self._futures.pop(call.msg_id, None)
        if call.children is not None:
            for vid in call.vids:
                self._futures.pop(vid, None)
                self._output_futures.pop(vid, None)
        call.output.set_result(None)

    def _output_done(self, call: Call, i: int):
        if self._calls.output_done(call, i):
            if call.children is not None and not call.children[i].output.done():
                call.children[i].output.set_result(None)
            if call.outputs_done and not call.output.done():
                self._call_finished(call)

    # ------------------------------------------- ipyparallel's API, per engine
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

    def _asyncresult_from_jobs(self, jobs=None, owner=False):
        many = isinstance(jobs, (list, tuple, set))
        for job in jobs if many else [jobs]:
            job = self.history[job] if isinstance(job, int) else job
            call, i = self._calls.of_vid(job)
            if call is None:
                continue
            if call.future.done():  # recent: its result, as ipyparallel caches one
                self.results[job] = self._result(call, i)
            else:  # in flight: that engine's future
                self._children_of(call)
        return super()._asyncresult_from_jobs(jobs, owner=owner)

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

    def _extract_metadata(self, msg):
        """ipyparallel's, with the engine's start time parsed by the fast C parser."""
        started = msg["metadata"].pop("started", None)
        md = super()._extract_metadata(msg)
        if started is not None:
            msg["metadata"]["started"] = started
            md["started"] = parse_date(started)
        return md

    # --------------------------------------------------------------- receive
    def _setup_streams(self):
        """IO thread, before its loop runs: the parent's streams, each read by
        a ``contained`` handler (an exception is logged, never stops a stream)."""
        self._codec = P.Codec(self.session)
        self._root_watch = RootWatch(self.root_ping_interval, self.root_timeout)
        super()._setup_streams()
        handlers = [
            (self._query_stream, self._dispatch_single_reply, "query", None),
            (self._control_stream, self._dispatch_single_reply, "control", self._reply_failed),
            (self._mux_stream, self._dispatch_reply, "mux", self._reply_failed),
            (self._task_stream, self._dispatch_reply, "task", self._reply_failed),
            (self._iopub_stream, self._dispatch_iopub, "IOPub", self._iopub_failed),
            (self._notification_stream, self._dispatch_notification, "notification", None),
            (self._broadcast_stream, self._dispatch_broadcast, "broadcast", None),
        ]
        for stream, handler, what, on_error in handlers:
            stream.on_recv(contained(handler, self.session, what, on_error), copy=False)
        self._broadcast_stream.on_send(guarded_callback(self._broadcast_sent, "broadcast send"))
        pings = PeriodicCallback(guarded_callback(self._watch_root, "root watch"),
                                 self.root_ping_interval * 1e3, jitter=0.1)
        self._io_loop.add_callback(pings.start)  # on this loop, once it runs

    def _parent_id(self, frames):
        """The msg_id a raw message answers, or None if it cannot be read."""
        try:
            body = P.split_idents(frames)[1]
            return (self.session.unpack(P.as_bytes(body[2])) or {}).get("msg_id")
        except Exception:
            return None

    def _reply_failed(self, frames, exc):
        """A reply that could not be handled fails its own request, at once."""
        msg_id = self._parent_id(frames)
        future = self._futures.get(msg_id)
        if future is not None and not future.done():  # an error result, as ipyparallel's
            failure = RuntimeError(f"the client could not handle the reply: {exc!r}")
            self.results[msg_id] = failure
            self.outstanding.discard(msg_id)
            future.set_result(failure)
        output = self._output_futures.get(msg_id)
        if output is not None and not output.done():
            output.set_result(None)

    def _iopub_failed(self, frames, exc):
        """An IOPub message that could not be handled is dropped; if it was the
        ``status`` that ends a request's output, that output is complete."""
        try:
            idents, body = P.split_idents(frames)
            header, parent, metadata = (self.session.unpack(P.as_bytes(b)) for b in body[1:4])
        except Exception:
            return
        if header.get("msg_type") != "status":
            return
        msg_id = (parent or {}).get("msg_id")
        call = self._calls.get(msg_id)
        if call is not None:  # one engine's part of a broadcast
            i = call.index.get(metadata.get("engine") or self._engines.get(P.engine_of_topic(idents)))
            if i is not None:
                self._output_done(call, i)
            return
        output = self._output_futures.get(msg_id)
        if output is not None and not output.done():
            output.set_result(None)

    def _to_root(self, msg_id, send, *args, **kwargs):
        """IO thread: hand a request to the socket, and watch for it."""
        self._root_watch.sent(msg_id)
        send(*args, **kwargs)

    def _watch_root(self):
        """Ping the root about requests waited on; fail what it lost."""
        ids, lost = self._root_watch.tick()
        if ids:
            self._broadcast_stream.send_multipart(self._codec.pack(P.PING, dict(ids=ids)))
        self._root_lost(lost)

    def _root_lost(self, lost):
        """Requests that cannot come back: every engine's part fails."""
        if lost:
            log.error("%s: failing %d request(s)", lost[0][1], len(lost))
        for msg_id, why in lost:
            call = self._calls.get(msg_id)
            if call is not None:
                owed = [call.uuids[i] for i in call.pending()]
                self._settled(call, self._calls.fail(
                    call, owed, lambda eid: f"{why}; engine {eid} did not answer", util.utcnow()))
            future = self._reductions.pop(msg_id, None)
            if future is not None:
                failed = [[e, self._engines.get(e), f"{why}; engine {e} did not answer"] for e in future.targets]
                self._resolve_reduction(future, Reduction(future.op), [], failed)
            survey = self._surveys.get(msg_id)
            if survey is not None and not survey.done():
                survey.set_exception(ConnectionError(why))

    def _dispatch_broadcast(self, frames):
        arrived = time.time()
        try:
            _, body = P.split_idents(frames)
            msg = self._codec.unpack(body)
            kind = msg["header"].get("msg_type")
            if kind == P.PONG:  # the root's, not a reply
                return self._root_lost(self._root_watch.pong(msg["content"].get("unknown") or ()))
            self._replies_received += 1
            if kind == P.STATS_REPLY:
                self._root_watch.done(msg["content"].get("msg_id"))
                survey = self._surveys.get(msg["content"].get("msg_id"))
                if survey is not None and not survey.done():
                    survey.set_result(msg["content"].get("nodes", []))
                return
            if kind != P.BUNDLE:
                return self._dispatch_reply(frames)  # a stock broadcast reply
            msg_id = msg["metadata"].get("msg_id")
            self._traces.add(msg_id, "reply in", arrived, msg["metadata"].get("kind"))
            if msg_id in self._reductions:
                return self._reduced(self._reductions.pop(msg_id), msg)
            call = self._calls.get(msg_id)
            if call is None:
                log.debug("bundle for unknown broadcast %s", msg_id)
                return
            outcomes = P.iter_bundle(self._codec, msg)
            settled = self._calls.bundle(call, outcomes, util.utcnow(), self._codec.unpack, log)
        except P.ProtocolError as e:
            log.error("Dropped an invalid broadcast reply: %s", e)
            return
        self._settled(call, settled)

    def _reduced(self, future, msg):
        """Resolve a reduction: its value, or the engines' errors."""
        try:
            state, value, raised, failed = P.reduced_parts(msg)
            reduction = Reduction(state.get("op"))
            reduction.add_partial(state, value)
        except (P.ProtocolError, ValueError) as e:
            log.error("Dropped an invalid reduction reply: %s", e)
            return
        self._resolve_reduction(future, reduction, raised, failed)

    def _resolve_reduction(self, future, reduction, raised, failed):
        errors = [error.unwrap_exception(self._codec.unpack(r)["content"]) for r in raised]
        errors += [error.unwrap_exception(engine_error(*f[:3], "apply")) for f in failed]
        order = {eid: i for i, eid in enumerate(future.targets)}
        errors.sort(key=lambda e: order.get((e.engine_info or {}).get("engine_id"), -1))
        try:
            if errors:
                error.collect_exceptions(errors, "reduce")
            future.set_result(reduction.result())
        except error.CompositeError as e:  # keep what the survivors combined
            e.partial = reduction.partial()
            future.set_result(e)
        except Exception as e:
            future.set_result(e)

    def _dispatch_iopub(self, frames):
        """Route an engine's output for a broadcast to that engine's part."""
        try:
            idents, body = self.session.feed_identities(frames, copy=False)
            msg = self.session.deserialize(body, content=True, copy=False)
        except Exception as e:
            log.error("Dropped an invalid IOPub message: %s", e)
            return
        parent = msg["parent_header"]
        msg_id = parent.get("msg_id") if parent else None
        call = self._calls.get(msg_id) if msg_id else None
        if call is not None:
            uuid = msg["metadata"].get("engine") or self._engines.get(P.engine_of_topic(idents))
            i = call.index.get(uuid)
            if i is None:
                return
            if msg["header"]["msg_type"] == "status":
                if msg["content"].get("execution_state") == "idle":
                    self._output_done(call, i)
                return
            outcome_metadata(self, call, i)  # ipyparallel's handler below fills it
            msg["parent_header"] = dict(parent, msg_id=call.vids[i])
        elif (P.is_broadcast_id(msg_id) and msg_id not in self._reductions
              and not msg["header"]["msg_type"].startswith("comm_")):
            return  # output of a finished broadcast (e.g. a thread printing late)
        return _UPSTREAM_IOPUB(self, msg)
