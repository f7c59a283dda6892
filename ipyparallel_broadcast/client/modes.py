"""Reply-mode settings: partial coalescing (``Batch``), and ``'auto'`` mode's
choice per call (by the size of a function's earlier replies). Shared by
``view`` and ``collectives``; the wire form of a mode is ``calls.reply_mode``."""

from __future__ import annotations

from dataclasses import dataclass

from ipyparallel.client.remotefunction import getname

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
