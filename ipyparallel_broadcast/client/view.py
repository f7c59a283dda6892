"""``BroadcastView``: a DirectView whose every call is one message to the tree.

Everything DirectView builds on ``apply`` and ``execute`` (push, pull,
``view[key]``, ...) goes through the tree, and so do the collectives, natively:
``scatter`` and ``map`` send one message carrying every engine's share (each
hop forwards only its subtree's), ``gather`` is one pull, and ``reduce``
combines results on the way up. AsyncResults are DirectView's: target order,
per-engine metadata and outputs, ``CompositeError`` on remote exceptions.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from functools import partial, wraps
from typing import Optional

from ipyparallel import util
from ipyparallel.client.map import Map, dists
from ipyparallel.client.remotefunction import ParallelFunction, _map, getname, sync_view_results
from ipyparallel.client.view import DirectView, sync_results
from ipyparallel.serialize import PrePickled, pack_apply_message
from traitlets import Any, Bool, List, TraitError, validate

from ..wire import protocol as P
from .history import History
from .paths import DIRECT, TREE
from ..wire.reduction import OPS, engine_value
from .results import TreeAsyncMapResult, TreeAsyncResult

AUTO = "auto"
AUTO_STREAM_BYTES = 4 * 2**20  # auto mode streams calls expected to return more
REPLY_SIZES_KEPT = 1024  # auto mode remembers the reply sizes of this many functions (the newest)


def save_ids(method):
    """ipyparallel's ``save_ids``: the view's history and outstanding get the
    ids the call added to the client's, a broadcast as one history entry."""

    @wraps(method)
    def saving(self, *args, **kwargs):
        before = len(self.client.history)
        try:
            return method(self, *args, **kwargs)
        finally:
            new = self.client.history.tail(before)
            self.history.extend(new)
            self.outstanding.update(new)

    return saving


def reply_key(f):
    """What auto mode knows a function's replies by: where its code is defined
    (every lambda is named ``<lambda>``); a callable without code, by itself."""
    f = getattr(f, "func", f)  # a partial (or PrePickled): the function inside
    code = getattr(f, "__code__", None)
    if code is None:
        return getname(f)
    return (code.co_filename, code.co_firstlineno, getattr(f, "__qualname__", code.co_name))


@dataclass(frozen=True)
class Batch:
    """Partial coalescing: each leaf sends its replies up ``count`` at a time,
    or whatever arrived within ``interval`` seconds."""

    count: int
    interval: Optional[float] = None

    def __post_init__(self):
        if type(self.count) is not int or self.count < 1:
            raise ValueError(f"Batch count must be a positive int, not {self.count!r}")
        if self.interval is not None and not self.interval >= 0:
            raise ValueError(f"Batch interval must be >= 0 seconds, not {self.interval!r}")


def reply_mode(coalescing) -> tuple:
    """``(reply, batch)`` on the wire for a fixed ``coalescing`` setting."""
    if coalescing is True:
        return P.COALESCE, None
    if coalescing is False:
        return P.STREAM, None
    return P.STREAM, [coalescing.count, coalescing.interval]


class BroadcastView(DirectView):
    """Reach many engines with one message per call, through the relay tree.

    ``coalescing``: ``True`` (default), the tree merges all replies into one
    message; ``False``, each engine's reply is streamed back as it arrives;
    ``k`` or ``Batch(count=k, interval=t)``, leaves send replies in batches;
    ``"auto"``, streaming for calls that do not block or are expected to
    return more than ``AUTO_STREAM_BYTES`` in all, coalescing otherwise.
    """

    coalescing = Any(True, help="True, False, a batch size, a Batch, or 'auto'.")
    history = History(help="msg_ids of this view's calls, one per engine (a broadcast is one entry)")
    stream_outputs = Bool(
        False,
        help="Engines publish apply's outputs on IOPub as they come (and busy/idle "
        "status), as for DirectView. Off: outputs come inside each reply, which costs "
        "every engine, the controller and the client far less. execute (%%px) always streams.",
    )
    trace = Bool(
        False,
        help="Record when each call passes the client, every relay node and every engine: "
        "ar.trace (see ipyparallel_broadcast.client.display.trace). A flag, since apply's keyword "
        "arguments belong to the function.",
    )
    path = Any(None, help="scatter, gather and map: 'tree', 'direct' or 'auto' (see "
               "ipyparallel_broadcast.client.paths); None: the client's broadcast_path.")
    _flag_names = List(["targets", "block", "track", "label", "coalescing", "stream_outputs", "trace",
                        "path"])

    @validate("path")
    def _valid_path(self, proposal):
        if proposal["value"] not in (None, AUTO, TREE, DIRECT):
            raise TraitError(f"path must be 'tree', 'direct', 'auto' or None, not {proposal['value']!r}")
        return proposal["value"]

    @validate("coalescing")
    def _valid_coalescing(self, proposal):
        value = proposal["value"]
        if isinstance(value, bool) or value == AUTO or isinstance(value, Batch):
            return value
        if type(value) is int:
            return Batch(value)
        raise TraitError(f"coalescing must be True, False, an int, a Batch or 'auto', not {value!r}")

    def __init__(self, client=None, socket=None, targets=None, coalescing=True, **flags):
        super().__init__(client=client, socket=socket, targets=targets, **flags)
        self.coalescing = coalescing
        self.history.limit = getattr(self.client, "history_limit", 0)
        self._reply_sizes = {}  # reply_key -> bytes per engine last seen (auto mode), newest last
        self._sizing = {}  # reply_key -> its newest call in flight (auto mode)
        self._sizes_lock = threading.Lock()  # learnt by the I/O thread or the caller's

    @property
    def is_coalescing(self) -> bool:  # ipyparallel's name
        return self.coalescing is True

    @is_coalescing.setter
    def is_coalescing(self, value):
        self.coalescing = bool(value)

    def __repr__(self):
        mode = {True: "coalescing", False: "streaming"}.get(self.coalescing, self.coalescing)
        return f"<BroadcastView {self._targets_repr()} {mode}>"

    def _targets_repr(self):
        t = self.targets
        if isinstance(t, (list, tuple)) and len(t) > 4:
            return f"[{t[0]}, {t[1]}, ..., {t[-1]}] ({len(t)} engines)"
        return repr(t)

    # ------------------------------------------------------------ sending
    def _reply_for(self, key, n, block) -> tuple:
        if self.coalescing != AUTO:
            return reply_mode(self.coalescing)
        last = self._sizing.get(key)
        if last is not None and last.future.done():  # done, its callback maybe not yet run
            self._learn_size(key, last)
        large = self._reply_sizes.get(key, 0) * n > AUTO_STREAM_BYTES
        return reply_mode(bool(block) and not large)

    def _broadcast(self, msg_type, targets, fname, content=None, buffers=(), metadata=None,
                   track=False, block=False, each=None, reduce=None, key=None):
        """``key``: what 'auto' knows this call's replies by (default: ``fname``)."""
        targets = self.targets if targets is None else targets
        key = fname if key is None else key
        uuids, eids = self.client.resolve_targets(targets)
        reply, batch = (P.COALESCE, None) if reduce else self._reply_for(key, len(eids), block)
        sent = self.client.send_broadcast(
            msg_type, eids, uuids, content=content, buffers=buffers, metadata=metadata,
            reply=reply, track=track, each=each, batch=batch, reduce=reduce, trace=self.trace,
        )
        if reduce:  # one future: the combined value
            return TreeAsyncResult(self.client, sent, fname=fname, targets=eids, owner=True)
        if self.coalescing == AUTO:
            self._sizing[key] = sent
            sent.future.add_done_callback(lambda _: self._learn_size(key, sent))
        return TreeAsyncResult(self.client, sent, fname=fname, targets=eids, owner=True,
                               single=isinstance(targets, int))

    def _learn_size(self, key, call):
        known = [sum(memoryview(b).nbytes for b in o[1]["buffers"])
                 for o in call.outcomes if o is not None and o[0] == "reply"]
        with self._sizes_lock:
            if self._sizing.get(key) is call:
                del self._sizing[key]
            if known:
                self._reply_sizes.pop(key, None)
                self._reply_sizes[key] = sum(known) / len(known)
                if len(self._reply_sizes) > REPLY_SIZES_KEPT:
                    del self._reply_sizes[next(iter(self._reply_sizes))]  # the oldest

    def _apply(self, f, targets, args=(), kwargs=None, each=None, track=False, label=None,
               block=False, fname=None, reduce=None):
        """One ``apply_request`` for all targets. ``f`` and the shared ``args`` /
        ``kwargs`` are serialized once; ``each`` gives every target (in order)
        its own ``(args, kwargs)`` instead."""
        session = self.client.session
        limits = dict(buffer_threshold=session.buffer_threshold,
                      item_threshold=session.item_threshold)
        pf = PrePickled(f)
        if each is None:
            buffers = pack_apply_message(pf, list(args), kwargs or {}, **limits)
            own = None
        else:
            nf = len(pf.buffers)
            own = [pack_apply_message(pf, a, k, **limits)[nf:] for a, k in each]
            buffers = pf.buffers
        metadata = dict(label=self.label if label is None else label)
        if not (self.stream_outputs or reduce):  # reductions' outputs stay on IOPub
            metadata[P.OUTPUTS_KEY] = "reply"
        return self._broadcast(
            "apply_request", targets, fname or getname(f), buffers=buffers, metadata=metadata, track=track,
            block=block, each=own, reduce=reduce, key=reply_key(f) if self.coalescing == AUTO else None,
        )

    @sync_results
    @save_ids
    def _really_apply(self, f, args=None, kwargs=None, targets=None, block=None, track=None, label=None):
        block = self.block if block is None else block
        track = self.track if track is None else track
        args = [PrePickled(a) for a in args or ()]
        kwargs = {k: PrePickled(v) for k, v in (kwargs or {}).items()}
        ar = self._apply(f, targets, args, kwargs, track=track, label=label, block=block)
        return _maybe_get(ar, block)

    @sync_results
    @save_ids
    def execute(self, code, silent=True, targets=None, block=None, label=None):
        """Run ``code`` on the targets; coalescing applies here too."""
        if not isinstance(code, str):
            raise TypeError(f"code must be text, not {type(code)}")
        block = self.block if block is None else block
        label = self.label if label is None else label
        content = dict(code=code, silent=bool(silent), user_expressions={})
        ar = self._broadcast("execute_request", targets, "execute", content=content,
                             metadata=dict(label=label), block=block,
                             key=("execute", code) if self.coalescing == AUTO else None)
        if block:
            try:
                ar.get()
                ar.wait_for_output()
            except KeyboardInterrupt:
                pass
        return ar

    # ---------------------------------------------------------- the path
    def _path_setting(self) -> str:
        return self.client.broadcast_path if self.path is None else self.path

    def _route(self, op: str, eids, nbytes: int) -> str:
        """``TREE`` or ``DIRECT`` for this call (traced calls take the tree)."""
        path = self._path_setting()
        if path != AUTO or self.trace:
            return DIRECT if path == DIRECT and not self.trace else TREE
        return self.client._paths.choose(self._kind(op), len(eids), nbytes)

    def _kind(self, op: str) -> str:
        """What the chooser learns apart: the operation in this view's reply mode
        (the tree coalescing and the tree streaming are two costs)."""
        return f"{op} {reply_mode(self.coalescing) if self.coalescing != AUTO else AUTO}"

    def _timed(self, op: str, eids, nbytes: int, path: str, send):
        """``send()``'s AsyncResult; once done, the client's chooser learns how
        long it took, if nothing else was in flight when it was sent (a time
        shared with other calls says little about the path)."""
        quiet, tic = not self.client.outstanding, time.perf_counter()
        ar = send()
        if quiet and self._path_setting() == AUTO and hasattr(ar, "add_done_callback"):
            chooser, kind = self.client._paths, self._kind(op)

            def done(future):
                if _succeeded(future):
                    chooser.record(kind, len(eids), nbytes, path, time.perf_counter() - tic)

            ar.add_done_callback(done)
        return ar

    def _direct(self, eids) -> DirectView:
        """DirectView's path to the same engines (one message each, via the hub's mux)."""
        return DirectView(client=self.client, socket=self.client._mux_stream, targets=list(eids))

    # -------------------------------------------------------- collectives
    @sync_results
    @save_ids
    def scatter(self, key, seq, dist="b", flatten=False, targets=None, block=None, track=None):
        """Partition ``seq`` among the targets with one message: each engine
        receives only its own part (NumPy arrays are split without copying)."""
        block = self.block if block is None else block
        track = self.track if track is None else track
        eids = self.client.resolve_targets(self.targets if targets is None else targets)[1]
        nbytes = _nbytes(seq)
        path = self._route("scatter", eids, nbytes)
        if path == DIRECT:
            ar = self._timed("scatter", eids, nbytes, path, lambda: self._direct(eids).scatter(
                key, seq, dist=dist, flatten=flatten, block=False, track=track))
        else:
            mapper = dists[dist]()
            parts = [mapper.getPartition(seq, i, len(eids)) for i in range(len(eids))]
            each = [((), {key: p[0] if flatten and len(p) == 1 else p}) for p in parts]
            ar = self._timed("scatter", eids, nbytes, path, lambda: self._apply(
                util._push, eids, each=each, track=track, block=block, fname="scatter"))
            ar._scatter_lengths = [len(p) for p in parts]
        if block:
            ar.wait()
        else:
            return ar

    @sync_results
    @save_ids
    def gather(self, key, dist="b", targets=None, block=None):
        """One pull from every target, joined in target order."""
        block = self.block if block is None else block
        eids = self.client.resolve_targets(self.targets if targets is None else targets)[1]
        nbytes = self.client._paths.sizes.get(key, 0)  # what a gather of this key last brought
        path = self._route("gather", eids, nbytes)
        if path == DIRECT:
            ar = self._timed("gather", eids, nbytes, path,
                             lambda: self._direct(eids).gather(key, dist=dist, block=False))
        else:
            def send():
                tree_ar = self._apply(util._pull, eids, (key,), block=block, fname="gather")
                tree_ar.owner = False
                return TreeAsyncMapResult(self.client, tree_ar._call, dists[dist](), fname="gather")
            ar = self._timed("gather", eids, nbytes, path, send)
        ar.add_done_callback(lambda f: _succeeded(f) and self.client._paths.remember_size(
            key, _nbytes(f.result())))
        return _maybe_get(ar, block)

    @sync_results
    def map(self, f, *sequences, block=None, track=False, return_exceptions=False, label=None):
        """``map(f, *sequences)`` in one message: one chunk per target, as DirectView."""
        block = self.block if block is None else block
        assert sequences, "must have some sequences to map onto!"
        path = eids = nbytes = None
        if self._path_setting() != TREE:  # (the tree resolves its targets itself)
            eids = self.client.resolve_targets(self.targets)[1]
            nbytes = sum(_nbytes(seq) for seq in sequences)
            path = self._route("map", eids, nbytes)
        if path == DIRECT:
            ar = self._timed("map", eids, nbytes, path, lambda: self._direct(eids).map(
                f, *sequences, block=False, track=track, return_exceptions=return_exceptions))
            return _maybe_get(ar, block)
        pf = TreeParallelFunction(self, f, block=False, track=track,
                                  return_exceptions=return_exceptions, label=label)
        if path is None:
            return _maybe_get(pf.map(*sequences), block)
        return _maybe_get(self._timed("map", eids, nbytes, path, lambda: pf.map(*sequences)), block)

    def parallel(self, dist="b", block=None, **flags):
        """Decorator for a ParallelFunction that runs through the tree."""
        block = self.block if block is None else block
        return lambda f: TreeParallelFunction(self, f, dist=dist, block=block, **flags)

    @sync_results
    @save_ids
    def reduce(self, f, *args, op="sum", targets=None, block=None, **kwargs):
        """``f(*args, **kwargs)`` on every target, combined with ``op``.

        ``sum``, ``prod``, ``min``, ``max``: combined in the tree (numbers or
        NumPy arrays of one shape and dtype); the client gets one value.
        ``concat``: results joined in target order (arrays along axis 0).
        """
        block = self.block if block is None else block
        targets = self.targets if targets is None else targets
        if op == "concat":
            eids = self.client.resolve_targets(targets)[1]
            with self.temp_flags(coalescing=True if self.coalescing == AUTO else self.coalescing):
                ar = self._apply(f, eids, [PrePickled(a) for a in args], kwargs, block=block,
                                 fname="reduce")
            ar.owner = False
            return _maybe_get(TreeAsyncMapResult(self.client, ar._call, Map(), fname="reduce"), block)
        if op not in OPS:
            raise ValueError(f"op must be one of {sorted(OPS) + ['concat']}, not {op!r}")
        ar = self._apply(partial(engine_value, f), targets, args, kwargs, block=block,
                         fname="reduce", reduce=op)
        return _maybe_get(ar, block)

    def compose(self, mode="counting", requests=None, targets=None, **settings) -> list:
        """Switch the target engines' compose mode; return each engine's status.

        ``requests`` (default: on for ``counting``) runs every request in a
        ``threads()`` region, so unchanged code gets the mode's threads.
        Other settings (``factor``, ``pin``, ``strict``) as in
        ``ipyparallel_broadcast.engine.compose.configure``.
        """
        from ..engine.compose import configure

        requests = mode == "counting" if requests is None else requests
        return self._really_apply(configure, (mode,), dict(requests=requests, **settings),
                                  targets=targets, block=True)


class TreeParallelFunction(ParallelFunction):
    """ParallelFunction whose chunks all go out in one message through the tree."""

    @sync_view_results
    def __call__(self, *sequences, **kwargs):
        mapping = kwargs.pop("__ipp_mapping", False)
        if kwargs:
            raise TypeError(f"Unexpected keyword arguments: {kwargs}")
        sequences = [s if hasattr(s, "__len__") else list(s) for s in sequences]
        lens = [len(s) for s in sequences]
        if max(lens) == 0:
            return []
        if not mapping and min(lens) != max(lens):
            raise ValueError(f"all sequences must have equal length, but have {lens}")
        view = self.view
        eids = view.client.resolve_targets(view.targets)[1]
        used, each, sizes = [], [], []
        for index, eid in enumerate(eids):
            args = [self.mapObject.getPartition(s, index, len(eids), max(lens)) for s in sequences]
            if sum(len(a) for a in args) == 0:
                continue
            used.append(eid)
            each.append(([PrePickled(a) for a in args], {}))
            sizes.append(min(len(a) for a in args) if mapping else 1)
        f = partial(_map, self.func) if mapping else self.func
        flags = dict(self.flags)
        ar = view._apply(f, used, each=each, track=flags.get("track", False),
                         label=flags.get("label"), block=self.block, fname=getname(self.func))
        ar.owner = False
        r = TreeAsyncMapResult(
            view.client, ar._call, self.mapObject, fname=getname(self.func),
            ordered=self.ordered, return_exceptions=self.return_exceptions,
            chunk_sizes=dict(zip(ar._call.vids, sizes)),
        )
        return _maybe_get(r, self.block)


def _succeeded(future) -> bool:
    return not future.cancelled() and future.exception() is None


def _nbytes(obj) -> int:
    """Bytes of an array, or a rough size of a sequence (8 a item): a size class."""
    nbytes = getattr(obj, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    try:
        return 8 * len(obj)
    except TypeError:
        return 0


def _maybe_get(ar, block):
    if block and hasattr(ar, "get"):  # (an empty map's result is [] already)
        try:
            return ar.get()
        except KeyboardInterrupt:
            pass
    return ar
