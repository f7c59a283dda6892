"""Reply modes and blocking: how a BroadcastView's call replies (coalesced,
streamed, in batches, or chosen per call in ``'auto'`` mode) and whether the
caller waits for it. Shared by ``view`` and ``collectives``."""

from __future__ import annotations

from dataclasses import dataclass

from ipyparallel.client.remotefunction import getname

from ..wire import protocol as P

AUTO = "auto"
AUTO_STREAM_BYTES = 4 * 2**20  # auto mode streams calls expected to return more
REPLY_SIZES_KEPT = 1024  # auto mode remembers the reply sizes of this many functions (the newest)


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
    interval: float | None = None

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


def maybe_get(ar, block):
    if block and hasattr(ar, "get"):  # (an empty map's result is [] already)
        try:
            return ar.get()
        except KeyboardInterrupt:
            pass
    return ar
