"""The collectives of a BroadcastView: scatter, gather, map, reduce,
allreduce and compose, and the path each takes (the tree, or DirectView's per-engine
messages, chosen per call from measured times: ``paths``). Part of
``BroadcastView`` (``view``)."""

from __future__ import annotations

import time
from concurrent.futures import Future
from functools import partial

from ipyparallel.client.map import Map, dists
from ipyparallel.client.remotefunction import (
    ParallelFunction,
    _map,
    getname,
    sync_view_results,
)
from ipyparallel.client.view import DirectView, sync_results
from ipyparallel.serialize import PrePickled

from ..compat import ipp
from ..wire.reduction import OPS, engine_value
from .calls import reply_mode
from .history import save_ids
from .modes import AUTO
from .paths import DIRECT, TREE
from .results import TreeAsyncMapResult, Unjoined
from .results import maybe_get as _maybe_get


class Collectives:
    """scatter, gather, map, parallel, reduce, allreduce and compose, and their paths."""

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
        return DirectView(client=self.client, socket=self.client._direct_stream, targets=list(eids))

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
            ar = self._timed(
                "scatter",
                eids,
                nbytes,
                path,
                lambda: self._direct(eids).scatter(key, seq, dist=dist, flatten=flatten, block=False, track=track),
            )
        else:
            mapper = dists[dist]()
            parts = [mapper.getPartition(seq, i, len(eids)) for i in range(len(eids))]
            each = [((), {key: p[0] if flatten and len(p) == 1 else p}) for p in parts]
            ar = self._timed(
                "scatter",
                eids,
                nbytes,
                path,
                lambda: self._apply(ipp.engine_push(), eids, each=each, track=track, block=block, fname="scatter"),
            )
            ar._part_lengths = [len(p) for p in parts]
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
            ar = self._timed(
                "gather", eids, nbytes, path, lambda: self._direct(eids).gather(key, dist=dist, block=False)
            )
        else:

            def send():
                tree_ar = self._apply(ipp.engine_pull(), eids, (key,), block=block, fname="gather")
                tree_ar.owner = False
                return TreeAsyncMapResult(self.client, tree_ar._call, dists[dist](), fname="gather")

            ar = self._timed("gather", eids, nbytes, path, send)
        ar.add_done_callback(lambda f: _succeeded(f) and self.client._paths.remember_size(key, _size_of(f)))
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
            ar = self._timed(
                "map",
                eids,
                nbytes,
                path,
                lambda: self._direct(eids).map(
                    f, *sequences, block=False, track=track, return_exceptions=return_exceptions
                ),
            )
            return _maybe_get(ar, block)
        pf = TreeParallelFunction(self, f, block=False, track=track, return_exceptions=return_exceptions, label=label)
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
                ar = self._apply(f, eids, [PrePickled(a) for a in args], kwargs, block=block, fname="reduce")
            ar.owner = False
            return _maybe_get(TreeAsyncMapResult(self.client, ar._call, Map(), fname="reduce"), block)
        if op not in OPS:
            raise ValueError(f"op must be one of {sorted(OPS) + ['concat']}, not {op!r}")
        ar = self._apply(partial(engine_value, f), targets, args, kwargs, block=block, fname="reduce", reduce=op)
        return _maybe_get(ar, block)

    @sync_results
    @save_ids
    def allreduce(self, f, *args, name, op="sum", targets=None, block=None, **kwargs):
        """``f(*args, **kwargs)`` on every target, combined with ``op`` as by
        ``reduce``, and the combined value bound to ``name`` in every target
        engine (as ``push`` binds it: one copy per host). The value does not
        come to the client: the result is None once every engine has it.

        If any engine raises, fails or gives a value that does not combine,
        no engine gets a new value (each keeps what ``name`` was before).
        """
        block = self.block if block is None else block
        if op not in OPS:
            raise ValueError(f"op must be one of {sorted(OPS)}, not {op!r}")
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"name must be a Python identifier, not {name!r}")
        targets = self.targets if targets is None else targets
        ar = self._apply(
            partial(engine_value, f), targets, args, kwargs, block=block, fname="allreduce", reduce=op, allreduce=name
        )
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
        return self._apply_call(configure, (mode,), dict(requests=requests, **settings), targets=targets, block=True)


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
        ar = view._apply(
            f,
            used,
            each=each,
            track=flags.get("track", False),
            label=flags.get("label"),
            block=self.block,
            fname=getname(self.func),
        )
        ar.owner = False
        r = TreeAsyncMapResult(
            view.client,
            ar._call,
            self.mapObject,
            fname=getname(self.func),
            ordered=self.ordered,
            return_exceptions=self.return_exceptions,
            chunk_sizes=dict(zip(ar._call.vids, sizes)),
        )
        return _maybe_get(r, self.block)


def _succeeded(future) -> bool:
    return not future.cancelled() and future.exception() is None


def _size_of(future) -> int:
    """A gather's size, its parts not joined for it (on the I/O thread: see ``results.Unjoined``)."""
    value = Future.result(future)  # as stored: a tree's parts are still apart
    return value.size(_nbytes) if type(value) is Unjoined else _nbytes(value)


def _nbytes(obj) -> int:
    """Bytes of an array, or a rough size of a sequence (8 a item): a size class."""
    nbytes = getattr(obj, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    try:
        return 8 * len(obj)
    except TypeError:
        return 0
