"""``BroadcastView``: a DirectView whose every call is one message to the tree.

Everything DirectView builds on ``apply`` and ``execute`` (push, pull,
``view[key]``, scatter, gather, map, ...) goes through the tree too, and the
AsyncResult is DirectView's: results in target order, per-engine metadata and
outputs, ``CompositeError`` on remote exceptions.
"""

from __future__ import annotations

from ipyparallel.client.asyncresult import AsyncResult
from ipyparallel.client.view import DirectView, save_ids, sync_results
from ipyparallel.serialize import PrePickled, pack_apply_message
from ipyparallel.client.remotefunction import getname
from traitlets import Bool

from . import protocol as P


class BroadcastView(DirectView):
    """Reach many engines with one message per call, through the relay tree.

    ``coalescing=True`` (default): the tree merges all replies into one message.
    ``coalescing=False``: each engine's reply is streamed back as it arrives.
    """

    coalescing = Bool(True, help="Merge replies in the tree (True) or stream them (False).")

    def __init__(self, client=None, socket=None, targets=None, coalescing=True, **flags):
        super().__init__(client=client, socket=socket, targets=targets, **flags)
        self.coalescing = coalescing

    @property
    def is_coalescing(self) -> bool:  # ipyparallel's name
        return self.coalescing

    @is_coalescing.setter
    def is_coalescing(self, value):
        self.coalescing = bool(value)

    def __repr__(self):
        mode = "coalescing" if self.coalescing else "streaming"
        return f"<BroadcastView {self._targets_repr()} {mode}>"

    def _targets_repr(self):
        t = self.targets
        if isinstance(t, (list, tuple)) and len(t) > 4:
            return f"[{t[0]}, {t[1]}, ..., {t[-1]}] ({len(t)} engines)"
        return repr(t)

    def _broadcast(self, msg_type, targets, fname, content=None, buffers=(), metadata=None, track=False):
        targets = self.targets if targets is None else targets
        idents, eids = self.client._build_targets(targets)
        uuids = [i.decode("utf8") for i in idents]
        reply = P.COALESCE if self.coalescing else P.STREAM
        futures = self.client.send_broadcast(
            msg_type, eids, uuids, content=content, buffers=buffers,
            metadata=metadata, reply=reply, track=track,
        )
        if isinstance(targets, int):
            futures = futures[0]
        return AsyncResult(self.client, futures, fname=fname, targets=eids, owner=True)

    @sync_results
    @save_ids
    def _really_apply(self, f, args=None, kwargs=None, targets=None, block=None, track=None, label=None):
        args = [] if args is None else args
        kwargs = {} if kwargs is None else kwargs
        block = self.block if block is None else block
        track = self.track if track is None else track
        label = self.label if label is None else label
        session = self.client.session
        buffers = pack_apply_message(
            PrePickled(f),
            [PrePickled(a) for a in args],
            {k: PrePickled(v) for k, v in kwargs.items()},
            buffer_threshold=session.buffer_threshold,
            item_threshold=session.item_threshold,
        )
        ar = self._broadcast(
            "apply_request", targets, getname(f), buffers=buffers,
            metadata=dict(label=label), track=track,
        )
        if block:
            try:
                return ar.get()
            except KeyboardInterrupt:
                pass
        return ar

    @sync_results
    @save_ids
    def execute(self, code, silent=True, targets=None, block=None, label=None):
        """Run ``code`` on the targets; coalescing applies here too."""
        if not isinstance(code, str):
            raise TypeError(f"code must be text, not {type(code)}")
        block = self.block if block is None else block
        label = self.label if label is None else label
        content = dict(code=code, silent=bool(silent), user_expressions={})
        ar = self._broadcast("execute_request", targets, "execute", content=content, metadata=dict(label=label))
        if block:
            try:
                ar.get()
                ar.wait_for_output()
            except KeyboardInterrupt:
                pass
        return ar
