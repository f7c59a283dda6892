"""``ipyparallel_broadcast.Client``: ipyparallel's Client plus the broadcast tree.

One ``ipb_request`` goes out per call. Replies come back as bundles (coalesced
or streamed); each engine's reply inside is handed to ipyparallel's own reply
handling under a per-engine id ``f"{msg_id}_{uuid}"``, so AsyncResult,
metadata, outputs and errors behave exactly as for a DirectView.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FuturesTimeout
from functools import partial
from typing import Dict, List

import zmq
from tornado.ioloop import PeriodicCallback
from traitlets import Float, Integer

import ipyparallel as ipp
from ipyparallel import error
from ipyparallel.client.futures import MessageFuture

from . import protocol as P
from .protocol import engine_vid, parse_date
from .guard import contained, guarded_callback
from .reduction import Reduction
from .rootwatch import RootWatch
from .topology import TreeShape, render
from .trace import Traces, merge

log = logging.getLogger(__name__)
# ipyparallel's IOPub handling of a parsed message, taken once: a rebound
# ``ipyparallel.Client`` (a user's subclass, a mock) must not change it
_UPSTREAM_IOPUB = ipp.Client._dispatch_iopub.__wrapped__
_SENT = Future()
_SENT.set_result(None)


class EngineFuture(MessageFuture):
    """A MessageFuture without the Event and tracker Future it does not need:
    a broadcast creates two per engine, so their cost is on the hot path."""

    def __init__(self, msg_id, header=None, *, track=False):
        Future.__init__(self)
        self.msg_id = msg_id
        self.header = header
        self.track = track
        self._tracker = None
        self.tracker = Future() if track else _SENT
        self.iopub_callbacks = []
        self.output = None
        self.reply_bytes = None  # size of the engine's reply buffers, once known
        self.broadcast_id = None  # the msg_id of the broadcast this is part of

    def wait(self, timeout=None):
        try:
            self.exception(timeout)
        except FuturesTimeout:
            return False
        except CancelledError:
            pass
        return True


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
        self._broadcasts: Dict[str, dict] = {}  # msg_id -> request header, until all done
        self._tracking: Dict[int, tuple] = {}  # id(frames) -> (frames, futures) until sent
        self._real_ids: Dict[str, str] = {}  # per-engine id -> broadcast msg_id, until done
        self._reductions: Dict[str, MessageFuture] = {}  # msg_id -> future, until done
        self._recent: Dict[str, tuple] = {}  # per-engine id -> (result, metadata), recent calls
        self._recent_calls: deque = deque()
        self._replies_received = 0  # messages from the tree (tests count them)
        self._surveys: Dict[str, Future] = {}  # stats msg_id -> future of the node list
        self._traces = Traces()  # events of recent traced calls (see ``trace``)
        super().__init__(*args, **kwargs)

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
    def send_broadcast(self, msg_type, eids, uuids, content=None, buffers=(),
                       metadata=None, reply=P.COALESCE, track=False, each=None,
                       batch=None, reduce=None, trace=False):
        """Sign one request for ``eids`` and send it to the root of the tree.

        ``each``: every target's own buffers, in target order, sent after the
        shared ``buffers``. ``batch``: ``[count, interval]`` for streaming.
        ``trace``: record the call's path (``broadcast_trace``).
        Returns one MessageFuture per engine, in target order; with ``reduce``
        (an op of ``reduction.OPS``), one future for the combined value.
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
            futures = self._reduce_future(msg_id, inner["header"], track)
            futures[0].targets, futures[0].op = list(eids), reduce
        else:
            futures = self._engine_futures(msg_id, inner["header"], uuids, track)
        for future in futures:
            future.broadcast_id = msg_id
        envelope = self.session.msg(P.REQUEST, content=P.validate_request(request))

        to_send = self.session.serialize(envelope) + frames
        biggest = max((memoryview(f).nbytes for f in frames[5:]), default=0)
        copy = biggest < self.session.copy_threshold
        if track:
            self._tracking[id(to_send)] = (to_send, futures)
        # through the ZMQStream: a send behind its back can eat the socket's
        # edge-triggered read event, and replies would wait unread
        send = self._broadcast_stream.send_multipart
        if trace:
            send = partial(self._send_traced, msg_id, send)
        self._io_loop.add_callback(self._to_root, msg_id, send, to_send, copy=copy, track=track)
        return futures

    def _send_traced(self, msg_id, send, *args, **kwargs):
        self._traces.add(msg_id, "request out", time.time())
        send(*args, **kwargs)

    def _broadcast_sent(self, msg, status):
        """ZMQStream send callback: hand the zmq MessageTracker to the futures."""
        _, futures = self._tracking.pop(id(msg), (None, ()))
        for f in futures:
            if not f.tracker.done():
                f.tracker.set_result(status if isinstance(status, zmq.MessageTracker) else None)

    def _keep_recent(self, outcomes):
        """Remember the last ``broadcast_results_kept`` calls' results, so
        ``get_result`` / ``%pxresult`` find them (the hub never saw them)."""
        self._recent_calls.append([vid for vid, _, _ in outcomes])
        for vid, result, metadata in outcomes:
            self._recent[vid] = (result, metadata)
        while len(self._recent_calls) > max(self.broadcast_results_kept, 0):
            for vid in self._recent_calls.popleft():
                self._recent.pop(vid, None)

    def _asyncresult_from_jobs(self, jobs=None, owner=False):
        many = isinstance(jobs, (list, tuple, set))
        for job in jobs if many else [jobs]:
            job = self.history[job] if isinstance(job, int) else job
            if isinstance(job, str) and job in self._recent and job not in self._futures:
                self.results[job], metadata = self._recent[job]
                self.metadata[job].update(metadata)
        return super()._asyncresult_from_jobs(jobs, owner=owner)

    def _reduce_future(self, msg_id, header, track) -> List[MessageFuture]:
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
        return [future]

    def _engine_futures(self, msg_id, header, uuids, track) -> List[MessageFuture]:
        """One result future (with its output future) per engine, in order."""
        futures, vids = [], []
        left = [2 * len(uuids)]  # result and output futures not yet done

        def done(_):
            left[0] -= 1
            if not left[0]:  # the whole broadcast is finished: drop its caches
                self._traces.add(msg_id, "done", time.time())
                self._broadcasts.pop(msg_id, None)
                self._keep_recent([(f.msg_id, f.result(), f.output.metadata) for f in futures])
                for vid in vids:
                    self._real_ids.pop(vid, None)
                    for cache in (self.results, self._futures, self._output_futures, self.metadata):
                        cache.pop(vid, None)

        results_left = [len(uuids)]

        def replied(_):  # every engine's outcome is in: the root holds nothing more
            results_left[0] -= 1
            if not results_left[0]:
                self._root_watch.done(msg_id)

        self._broadcasts[msg_id] = header
        for uuid in uuids:
            vid = engine_vid(msg_id, uuid)
            vids.append(vid)
            self._real_ids[vid] = msg_id
            future = EngineFuture(vid, header, track=track)
            output = future.output = EngineFuture(vid, header)
            output.metadata = self.metadata[vid]
            self._futures[vid] = future
            self._output_futures[vid] = output
            self.outstanding.add(vid)
            self._outstanding_dict[uuid].add(vid)
            self.history.append(vid)
            future.add_done_callback(replied)
            future.add_done_callback(done)
            output.add_done_callback(done)
            futures.append(future)
        return futures

    def abort(self, jobs=None, targets=None, block=None):
        """ipyparallel's abort; a broadcast's per-engine ids are translated to
        the one msg_id its engines know."""
        jobs = list(self.outstanding) if jobs is None else jobs
        if isinstance(jobs, (str, ipp.AsyncResult)):
            jobs = [jobs]
        msg_ids = []
        for job in jobs:
            ids = job.msg_ids if isinstance(job, ipp.AsyncResult) else [job]
            msg_ids.extend(self._real_ids.get(i, i) if isinstance(i, str) else i for i in ids)
        return super().abort(list(dict.fromkeys(msg_ids)), targets=targets, block=block)

    def _handle_stranded_msgs(self, eid, uuid):
        """ipyparallel's, less the parts of broadcasts: the tree fails those a
        moment later, and says more (the host, its relay)."""
        outstanding = self._outstanding_dict[uuid]
        ours = {vid for vid in outstanding if vid in self._real_ids}
        outstanding.difference_update(ours)
        try:
            super()._handle_stranded_msgs(eid, uuid)
        finally:
            outstanding.update(ours)

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
        if msg_id in self._broadcasts:  # one engine's part of a broadcast
            uuid = metadata.get("engine") or self._engines.get(P.engine_of_topic(idents))
            msg_id = engine_vid(msg_id, uuid)
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
        uuids = {u: e for e, u in self._engines.items()}
        for msg_id, why in lost:
            for vid in [v for v, m in self._real_ids.items() if m == msg_id]:
                uuid = vid[len(msg_id) + 1:]
                eid = uuids.get(uuid)
                self._engine_failed(msg_id, eid, uuid, f"{why}; engine {eid} did not answer", P.UNREACHABLE)
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
            if msg["header"].get("msg_type") == P.PONG:  # the root's, not a reply
                return self._root_lost(self._root_watch.pong(msg["content"].get("unknown") or ()))
            self._replies_received += 1
            if msg["header"].get("msg_type") == P.STATS_REPLY:
                self._root_watch.done(msg["content"].get("msg_id"))
                survey = self._surveys.get(msg["content"].get("msg_id"))
                if survey is not None and not survey.done():
                    survey.set_result(msg["content"].get("nodes", []))
                return
            if msg["header"].get("msg_type") != P.BUNDLE:
                return self._dispatch_reply(frames)  # a stock broadcast reply
            msg_id = msg["metadata"].get("msg_id")
            self._traces.add(msg_id, "reply in", arrived, msg["metadata"].get("kind"))
            if msg_id in self._reductions:
                return self._reduced(self._reductions.pop(msg_id), msg)
            if msg_id not in self._broadcasts:
                log.debug("bundle for unknown broadcast %s", msg_id)
                return
            outcomes = list(P.iter_bundle(self._codec, msg))
        except P.ProtocolError as e:
            log.error("Dropped an invalid broadcast reply: %s", e)
            return
        for what, item in outcomes:
            reply = None
            try:
                if what == "parsed":  # spliced by the leaf, signed with the bundle
                    reply = item
                    item["parent_header"] = self._broadcasts[msg_id]
                elif what == "reply":
                    reply = self._codec.unpack(item)
                else:
                    self._engine_failed(msg_id, *item)
                    continue
                self._engine_reply(msg_id, reply)
            except Exception as e:
                log.error("Dropped an engine reply in a bundle of %s", msg_id, exc_info=True)
                self._unhandled_reply(msg_id, reply, e)

    def _unhandled_reply(self, msg_id, reply, exc):
        """An engine's reply that could not be handled fails that engine; one
        that could not even be read is failed by the root watch (the root no
        longer holds the request)."""
        uuid = ((reply or {}).get("metadata") or {}).get("engine")
        if isinstance(uuid, str) and msg_id in self._broadcasts:
            eid = {u: e for e, u in self._engines.items()}.get(uuid)
            self._engine_failed(msg_id, eid, uuid, f"its reply could not be handled: {exc!r}")

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
        errors += [error.unwrap_exception(self._engine_error(*f[:3], "apply")) for f in failed]
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

    @staticmethod
    def _engine_error(eid, uuid, message, method):
        """Error content for an engine that cannot answer (as an engine's own,
        ``engine_info`` with ``method``, which rendering the error needs)."""
        try:
            raise error.EngineError(message)
        except error.EngineError:
            return error.wrap_exception(dict(engine_uuid=uuid, engine_id=eid, method=method))

    def _engine_reply(self, msg_id, reply):
        if reply["parent_header"].get("msg_id") != msg_id:
            raise P.ProtocolError("engine reply to another request")
        vid = engine_vid(msg_id, reply["metadata"].get("engine"))
        if vid not in self.outstanding:
            return  # e.g. already failed when the client saw the engine die
        future = self._futures.get(vid)
        if future is not None:  # auto mode learns reply sizes from it
            future.reply_bytes = sum(memoryview(b).nbytes for b in reply.get("buffers", ()))
        if msg_id in self._traces:
            self._traces.add_engine(msg_id, self._engines.get(reply["metadata"].get("engine")), reply)
        reply["parent_header"] = dict(reply["parent_header"], msg_id=vid)
        outputs = reply["metadata"].pop(P.OUTPUTS_KEY, None)
        if outputs is not None:  # our engine: what IOPub would have brought is here
            self._outputs_in_reply(vid, reply, outputs)
        if reply["header"]["msg_type"] == "execute_reply":
            self._handle_execute_reply(reply)
        else:
            self._handle_apply_reply(reply)
        if outputs is not None and not outputs.get("iopub"):
            output = self._output_futures.get(vid)
            if output is not None and not output.done():
                output.set_result(None)  # no IOPub status will come

    def _outputs_in_reply(self, vid, reply, outputs):
        """File an engine's outputs, carried in its reply, as IOPub would have."""
        md = self.metadata[vid]
        for name in ("stdout", "stderr"):
            text = outputs.get(name) or ""
            if text:
                md[name] = (md[name] or "") + text
        md["outputs"].extend(outputs.get("outputs") or ())
        if reply["content"].get("status") == "error":
            md["error"] = self._unwrap_exception(reply["content"])

    def _engine_failed(self, msg_id, eid, uuid, message, code=None):
        uuid = uuid or self._engines.get(eid)  # interior nodes know engines by id only
        vid = engine_vid(msg_id, uuid)
        if uuid is None or vid not in self.outstanding:
            return
        method = self._broadcasts[msg_id]["msg_type"].split("_")[0]  # apply or execute
        reply = self.session.msg("apply_reply", content=self._engine_error(eid, uuid, message, method))
        reply["parent_header"]["msg_id"] = vid
        reply["metadata"]["engine"] = uuid
        self._handle_apply_reply(reply)
        output = self._output_futures.get(vid)
        if output is not None and not output.done():
            output.set_result(None)  # a dead engine sends no more output

    def _dispatch_iopub(self, frames):
        """Route an engine's output for a broadcast to that engine's result."""
        try:
            idents, body = self.session.feed_identities(frames, copy=False)
            msg = self.session.deserialize(body, content=True, copy=False)
        except Exception as e:
            log.error("Dropped an invalid IOPub message: %s", e)
            return
        parent = msg["parent_header"]
        msg_id = parent.get("msg_id") if parent else None
        if msg_id in self._broadcasts:
            uuid = msg["metadata"].get("engine") or self._engines.get(P.engine_of_topic(idents))
            msg["parent_header"] = dict(parent, msg_id=engine_vid(msg_id, uuid))
        elif (P.is_broadcast_id(msg_id) and msg_id not in self._reductions
              and not msg["header"]["msg_type"].startswith("comm_")):
            return  # output of a finished broadcast (e.g. a thread printing late)
        return _UPSTREAM_IOPUB(self, msg)
