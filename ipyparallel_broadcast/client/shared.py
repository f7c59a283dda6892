"""Big reply buffers from engines of the client's host, read from shared
memory: each engine wrote them once into a segment named for this client
(``host.shm.share_reply``), and the relays carried the segment's name, not
the bytes. The client reads each segment once, into memory it keeps warm
between calls (``WarmBuffers``), and unlinks its name at once."""

from __future__ import annotations

import errno
import math
import mmap
import sys
from threading import Lock

from ..host import shm
from ..wire.bundles import ReplyTable
from ..wire.protocol import nbytes


class SharedReplies:
    """What this client asks of engines, and the segments it gets back."""

    def __init__(self, threshold: int, here: str | None = None, kept: int = 0):
        self.prefix = shm.reply_prefix()
        self.segments_read = 0
        self.buffers = WarmBuffers(kept)
        self.ask(threshold, shm.reply_identity() if here is None else here)

    def ask(self, threshold: int, here: str):
        """Set ``spec``, the request metadata's ``SHM_REPLY_KEY`` (None: replies
        as usual): buffers of ``threshold`` bytes or more, from engines ``here``
        ("" where nothing shared can be proven: never asked)."""
        self.threshold, self.here = threshold, here
        self.spec = [here, self.prefix, threshold] if here and threshold > 0 else None

    def fill(self, table: ReplyTable) -> dict[int, str]:
        """Map each shared engine reply's buffers in place; ``{k: why}`` for
        those that cannot be read (those engines fail, naming why)."""
        for k, content in table.shm:
            try:
                ref = shm.Reference.from_content(content)
                if not ref.name.startswith(self.prefix):  # never another's: mapping unlinks it
                    raise shm.ShmError(errno.EPERM, f"segment {ref.name} is not this client's")
                buffers = table.parts[k]
                if any(not 0 <= index < len(buffers) or nbytes(buffers[index]) for index, _, _ in ref.bufs):
                    raise shm.ShmError(errno.EINVAL, f"segment {ref.name} names a buffer the reply lacks")
                for index, view in shm.read_reply(ref, self.buffers.take):
                    buffers[index] = view
                self.segments_read += 1
            except shm.ShmError as e:
                table.lost[k] = f"its reply's buffers in shared memory cannot be read ({e})"
        return table.lost

    def take_value(self, content) -> memoryview:
        """A reduce's value the root left in a segment named for this client:
        mapped (the value is the segment's memory: no copy), its name gone.
        Raises ``ShmError``."""
        ref = shm.Reference.from_content(content)
        if not ref.name.startswith(self.prefix) or len(ref.bufs) != 1:  # never another's: taking unlinks it
            raise shm.ShmError(errno.EPERM, f"segment {ref.name} is not one value of this client's")
        view = shm.take_value(ref)
        self.segments_read += 1
        return view

    def drop(self, table: ReplyTable):
        """A table no call will read (its call is gone): its segments go."""
        for _, content in table.shm:
            self._remove(content)

    def drop_value(self, value):
        """A reduce's value no call will read: its segment, if it has one, goes."""
        if isinstance(value, dict) and value.get("t") == "shm":
            self._remove(value.get("ref"))

    def _remove(self, content):
        try:
            ref = shm.Reference.from_content(content)
        except shm.ShmError:
            return
        if ref.name.startswith(self.prefix):  # never another's
            shm.remove(ref.name)

    def close(self) -> list[str]:
        """The client closes: segments still named for it go (replies never read),
        and the warm buffers no result holds."""
        self.buffers.clear()
        return shm.drop_prefix(self.prefix)


class WarmBuffers:
    """Memory for big reply buffers whose pages stay in place between calls.

    A fresh buffer costs a page fault per 4 KiB as it is first written (about
    1.5 us each on the benchmarks' machine: 3 ms of a gather of 8 MiB, with the
    GIL held if the segment is mapped); a buffer of the same size that no result
    holds any more is written again in place. Up to ``limit`` bytes are kept
    (the unheld oldest go first to make room); past that, buffers are fresh and
    go back to the OS with their result. Thread-safe: the I/O thread reads
    replies into them, the thread that reads a gather joins its parts into one."""

    def __init__(self, limit: int):
        self.limit, self.kept, self.reused, self.joined = limit, 0, 0, 0
        self.by_size: dict[int, list[mmap.mmap]] = {}
        self.lock = Lock()

    def take(self, nbytes: int) -> memoryview:
        """A writable buffer of ``nbytes``: a kept one no result holds, else a new one."""
        with self.lock:
            return self._take(nbytes)

    def concatenate(self, parts: list, least: int):
        """``numpy.concatenate(parts)`` in a buffer of ``take``, if the parts
        are plain arrays of one dtype and shape past the first axis, of ``least``
        bytes or more in all (never if ``least`` is 0 or nothing is kept); else
        None. NumPy asks for huge pages for a big new array: measured, 15-20 ms
        of faults and compaction for 8 MiB once memory was fragmented."""
        np = sys.modules.get("numpy")
        first = parts[0] if parts else None
        if least <= 0 or self.limit <= 0 or np is None or type(first) is not np.ndarray:
            return None
        if first.ndim == 0 or first.dtype.hasobject:
            return None
        dtype, rest, rows = first.dtype, first.shape[1:], 0
        for part in parts:
            if type(part) is not np.ndarray or part.dtype != dtype or part.shape[1:] != rest:
                return None
            rows += part.shape[0]
        count = rows * math.prod(rest)
        if count * dtype.itemsize < least:
            return None
        out = np.frombuffer(self.take(count * dtype.itemsize), dtype=dtype, count=count).reshape((rows, *rest))
        np.concatenate(parts, out=out)
        self.joined += 1
        return out

    def _take(self, nbytes: int) -> memoryview:
        size = max(-(-nbytes // mmap.PAGESIZE), 1) * mmap.PAGESIZE
        kept = self.by_size.get(size)
        if kept:
            mm = _first_unheld(kept, _UNHELD)
            if mm is not None:
                self.reused += 1
                return memoryview(mm)[:nbytes]
        mm = mmap.mmap(-1, size)
        if size <= self.limit and (self.kept + size <= self.limit or self._make_room(size)):
            self.by_size.setdefault(size, []).append(mm)
            self.kept += size
        return memoryview(mm)[:nbytes]

    def _make_room(self, size: int) -> bool:
        """Let go of unheld buffers until ``size`` more bytes fit; whether they do."""
        for other in list(self.by_size):
            kept = self.by_size[other]
            while self.kept + size > self.limit:
                mm = _first_unheld(kept, _UNHELD)
                if mm is None:
                    break
                kept.remove(mm)
                self.kept -= other
            if not kept:
                del self.by_size[other]
            if self.kept + size <= self.limit:
                return True
        return False

    def clear(self):
        """Keep nothing (buffers results still hold live on with them)."""
        with self.lock:
            self.by_size.clear()
            self.kept = 0


def _first_unheld(kept: list, unheld: int):
    """The first of ``kept`` that nothing but the list refers to (no result,
    no view: each holds a reference), else None. ``unheld``: the count then."""
    for mm in kept:
        if sys.getrefcount(mm) <= unheld:
            return mm
    return None


def _calibrated() -> int:
    """The reference count ``_first_unheld`` sees for an object only a list holds."""
    probe = [object()]
    return next(n for n in range(1, 16) if _first_unheld(probe, n) is not None)


_UNHELD = _calibrated()
