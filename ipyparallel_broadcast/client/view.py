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
import weakref

from ipyparallel.client.remotefunction import getname
from ipyparallel.client.view import sync_results
from ipyparallel.serialize import PrePickled, pack_apply_message
from traitlets import Any, Bool, List, TraitError, validate

from ..compat.ipp import ViewSeam
from ..wire import protocol as P
from .calls import reply_mode, reply_of
from .collectives import Collectives
from .history import History, save_ids
from .modes import AUTO, AUTO_STREAM_BYTES, REPLY_SIZES_KEPT, Batch, reply_key
from .outstanding import Outstanding
from .paths import DIRECT, TREE
from .results import ReducedAsyncResult, TreeAsyncResult
from .results import maybe_get as _maybe_get


class BroadcastView(Collectives, ViewSeam):
    """Reach many engines with one message per call, through the relay tree.

    ``coalescing``: ``True`` (default), the tree merges all replies into one
    message; ``False``, each engine's reply is streamed back as it arrives;
    ``k`` or ``Batch(count=k, interval=t)``, leaves send replies in batches;
    ``"auto"``, streaming for calls that do not block or are expected to
    return more than ``AUTO_STREAM_BYTES`` in all, coalescing otherwise.
    """

    coalescing = Any(True, help="True, False, a batch size, a Batch, or 'auto'.")
    history = History(help="msg_ids of this view's calls, one per engine (a broadcast is one entry)")
    outstanding = Outstanding(help="msg_ids of this view's calls not yet answered (a broadcast is one entry)")
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
    path = Any(
        None,
        help="scatter, gather and map: 'tree', 'direct' or 'auto' (see "
        "ipyparallel_broadcast.client.paths); None: the client's broadcast_path.",
    )
    _flag_names = List(["targets", "block", "track", "label", "coalescing", "stream_outputs", "trace", "path"])

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

    def _broadcast(
        self,
        msg_type,
        targets,
        fname,
        content=None,
        buffers=(),
        metadata=None,
        track=False,
        block=False,
        each=None,
        reduce=None,
        key=None,
        allreduce=None,
    ):
        """``key``: what 'auto' knows this call's replies by (default: ``fname``)."""
        targets = self.targets if targets is None else targets
        key = fname if key is None else key
        uuids, eids = self.client.resolve_targets(targets)
        reply, batch = (P.COALESCE, None) if reduce else self._reply_for(key, len(eids), block)
        sent = self.client.send_broadcast(
            msg_type,
            eids,
            uuids,
            content=content,
            buffers=buffers,
            metadata=metadata,
            reply=reply,
            track=track,
            each=each,
            batch=batch,
            reduce=reduce,
            trace=self.trace,
            allreduce=allreduce,
        )
        if reduce:  # one future: the combined value
            return ReducedAsyncResult(self.client, sent, fname=fname, targets=eids, owner=True)
        if self.coalescing == AUTO:
            self._sizing[key] = sent
            call = weakref.ref(sent)  # (the call's own future must not hold it: a cycle, freed late)
            sent.future.add_done_callback(lambda _: call() is not None and self._learn_size(key, call()))
        return TreeAsyncResult(
            self.client, sent, fname=fname, targets=eids, owner=True, single=isinstance(targets, int)
        )

    def _learn_size(self, key, call):
        known = [
            sum(memoryview(b).nbytes for b in reply_of(o)["buffers"])
            for o in call.outcomes
            if o is not None and o[0] == "reply"
        ]
        with self._sizes_lock:
            if self._sizing.get(key) is call:
                del self._sizing[key]
            if known:
                self._reply_sizes.pop(key, None)
                self._reply_sizes[key] = sum(known) / len(known)
                if len(self._reply_sizes) > REPLY_SIZES_KEPT:
                    del self._reply_sizes[next(iter(self._reply_sizes))]  # the oldest

    def _apply(
        self,
        f,
        targets,
        args=(),
        kwargs=None,
        each=None,
        track=False,
        label=None,
        block=False,
        fname=None,
        reduce=None,
        allreduce=None,
    ):
        """One ``apply_request`` for all targets. ``f`` and the shared ``args`` /
        ``kwargs`` are serialized once; ``each`` gives every target (in order)
        its own ``(args, kwargs)`` instead."""
        session = self.client.session
        limits = dict(buffer_threshold=session.buffer_threshold, item_threshold=session.item_threshold)
        pf = PrePickled(f)
        if each is None:
            buffers = pack_apply_message(pf, list(args), kwargs or {}, **limits)
            own = None
        else:
            nf = len(pf.buffers)
            own = [pack_apply_message(pf, a, k, **limits)[nf:] for a, k in each]
            buffers = pf.buffers
        metadata = dict(label=self.label if label is None else label)
        if not self.stream_outputs:  # (a reduction's come up the tree beside its value)
            metadata[P.OUTPUTS_KEY] = "reply"
        return self._broadcast(
            "apply_request",
            targets,
            fname or getname(f),
            buffers=buffers,
            metadata=metadata,
            track=track,
            block=block,
            each=own,
            reduce=reduce,
            key=reply_key(f) if self.coalescing == AUTO else None,
            allreduce=allreduce,
        )

    def _settle_outstanding(self):
        """ipyparallel's ``_sync_results``: what the client no longer waits for
        leaves the view's ``outstanding``, in place, a broadcast's ids as one
        entry (its three set operations each copied every engine's id)."""
        self.outstanding.intersection_update(self.client.outstanding)

    @sync_results
    @save_ids
    def _apply_call(self, f, args=None, kwargs=None, targets=None, block=None, track=None, label=None):
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
        ar = self._broadcast(
            "execute_request",
            targets,
            "execute",
            content=content,
            metadata=dict(label=label),
            block=block,
            key=("execute", code) if self.coalescing == AUTO else None,
        )
        if block:
            try:
                ar.get()
                ar.wait_for_output()
            except KeyboardInterrupt:
                pass
        return ar
