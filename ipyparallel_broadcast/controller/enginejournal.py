"""The hub's engines, journaled: what a restarted controller restores.

IPython Parallel's hub rewrites its whole engine-state file (every id and
uuid) at each registration and unregistration, O(N) each and O(N²) for N
engines, and reads it back with ``ipcontroller --restore``. Ours appends
one line per change instead, O(1): ``{"e": id, "u": uuid, "h": host}`` for
an engine filed (``h`` names the host relay that registered it, or is
null), ``{"g": id, ...}`` for an id granted to an engine whose heart has
not beaten yet (one that beats after a restart is filed then, not left
unregistered for good), ``{"d": id, ...}`` for an engine unregistered (the
hub's ``DroppedEngines`` tells one that lives on that it was dropped, after a
restart too; the last ``DROPS_KEPT``), ``{"x": id}`` for a grant gone.
The file is flushed per change, a host's batch one change (a killed
controller loses nothing the kernel has). A host's batch is also synced to
disk before the hub answers it (a group commit: what a host relay was told
survives a power loss of the controller's host, which its engines outlive);
other changes are synced once per burst (``statefile.CoalescedWrites``): an
engine on the controller's host goes down with it. When dead lines outnumber
live ones it is rewritten whole, by rename, and its directory synced too:
amortized O(1) per change. The file is its owner's alone (mode 0600,
whatever the umask): it names every engine of the cluster.

``JournalState`` is the sans-I/O part (lines in, the table out);
``EngineJournal`` owns the file; ``EngineLedger`` takes the hub's changes
as they happen (``hubhooks`` tells it) and writes their lines.
"""

from __future__ import annotations

import json
import logging
import os
from collections import OrderedDict
from collections.abc import Callable
from contextlib import contextmanager

log = logging.getLogger(__name__)
_LINE = json.JSONEncoder(separators=(",", ":"))  # (one encoder: ``json.dumps`` with options makes one a line)
SLACK = 64  # dead lines allowed beyond the live ones before a rewrite
DROPS_KEPT = 4096  # engines dropped that a restarted hub still knows (``dropped.REMEMBERED``)


class JournalState:
    """The table a journal's lines make: ``{id: (uuid, host or None)}`` and
    the highest id ever granted (ids are not reused)."""

    def __init__(self):
        self.engines: dict[int, tuple[str, str | None]] = {}
        self.granted: dict[int, tuple[str, str | None]] = {}  # ids granted, not yet filed
        self.dropped: OrderedDict[int, tuple[str, str | None]] = OrderedDict()  # engines unregistered, the last
        self.top = -1  # the highest id seen
        self.lines = 0  # lines read or written, live or not
        self.bad = 0  # lines that could not be read (a torn last line)

    def read(self, line: str) -> None:
        self.lines += 1
        try:
            entry = json.loads(line)
            if "x" in entry:
                self.engines.pop(int(entry["x"]), None)
                self.granted.pop(int(entry["x"]), None)
                return
            kind = next(k for k in ("g", "d", "e") if k in entry)
            eid, uuid, host = int(entry[kind]), entry["u"], entry.get("h")
            if not isinstance(uuid, str) or not (host is None or isinstance(host, str)):
                raise TypeError("uuid and host are strings")
        except (ValueError, TypeError, KeyError, AttributeError):
            self.bad += 1
            return
        self.add(kind, eid, uuid, host)

    def add(self, kind: str, eid: int, uuid: str, host: str | None) -> None:
        """An engine filed (``"e"``), granted its id (``"g"``) or dropped (``"d"``)."""
        self.granted.pop(eid, None)
        if kind == "d":
            self.engines.pop(eid, None)
            self.dropped[eid] = (uuid, host)
            while len(self.dropped) > DROPS_KEPT:
                self.dropped.popitem(last=False)
        else:
            (self.engines if kind == "e" else self.granted)[eid] = (uuid, host)
        self.top = max(self.top, eid)

    @staticmethod
    def filed(eid: int, uuid: str, host: str | None, kind: str = "e") -> str:
        return _LINE.encode({kind: eid, "u": uuid, "h": host}) + "\n"

    @staticmethod
    def gone(eid: int) -> str:
        return _LINE.encode(dict(x=eid)) + "\n"

    def whole(self) -> list[str]:
        """The live table as lines, the first carrying the top id (a gone
        engine's id is not granted again after a rewrite)."""
        lines = [self.filed(eid, uuid, host) for eid, (uuid, host) in self.engines.items()]
        lines += [self.filed(eid, uuid, host, "g") for eid, (uuid, host) in self.granted.items()]
        lines += [self.filed(eid, uuid, host, "d") for eid, (uuid, host) in self.dropped.items()]
        if self.top >= 0 and not any(self.top in t for t in (self.engines, self.granted, self.dropped)):
            lines[:0] = [self.filed(self.top, "", None), self.gone(self.top)]
        return lines

    def wants_rewrite(self) -> bool:
        return self.lines > 2 * (len(self.engines) + len(self.granted) + len(self.dropped)) + SLACK


def read(path: str) -> JournalState:
    """The table the journal at ``path`` holds (none if there is no file)."""
    state = JournalState()
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                state.read(line)
    return state


class EngineJournal:
    """The journal file: ``restore()`` reads it (or starts it empty),
    ``filed``/``gone`` append, ``sync()`` writes it to disk."""

    def __init__(self, path: str):
        self.path = path
        self.state = JournalState()
        self.file = None
        self.rewrites = self.commits = 0
        self.unsynced = 0  # lines appended since the last sync
        self.batching = 0  # inside ``batch()``: lines flushed once, at its end

    def restore(self, keep: bool) -> JournalState:
        """The table the file holds if ``keep`` (a restart), else none; the
        file is then rewritten with just that table."""
        if keep:
            self.state = read(self.path)
            if self.state.bad:
                log.warning("engine journal %s: %i unreadable line(s) skipped", self.path, self.state.bad)
        self._rewrite()
        return self.state

    def filed(self, eid: int, uuid: str, host: str | None, kind: str = "e") -> None:
        self.state.add(kind, eid, uuid, host)
        self._append(self.state.filed(eid, uuid, host, kind))

    def gone(self, eid: int) -> None:
        """A grant withdrawn (its engine filed, or set aside)."""
        if self.state.granted.pop(eid, None) is not None:
            self._append(self.state.gone(eid))

    def sync(self) -> None:
        if self.file is not None:
            self.file.flush()
            os.fsync(self.file.fileno())
            self.unsynced = 0

    def close(self, remove: bool = False) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
        if remove:
            try:
                os.remove(self.path)
            except FileNotFoundError:
                pass

    @contextmanager
    def batch(self, commit: bool = False):
        """The lines appended inside, flushed to the kernel once (a host's batch: one
        write); ``commit``: synced to disk too, before whatever follows (its answer)."""
        self.batching += 1
        try:
            yield
        finally:
            self.batching -= 1
            if not self.batching and self.file is not None:
                self.file.flush()
                if commit and self.unsynced:
                    self.sync()
                    self.commits += 1

    def _append(self, line: str) -> None:
        if self.file is None:
            return  # closed: the controller is stopping
        self.file.write(line)
        self.unsynced += 1
        if not self.batching:
            self.file.flush()
        self.state.lines += 1
        if self.state.wants_rewrite():
            self._rewrite()

    def _rewrite(self) -> None:
        lines = self.state.whole()
        tmp = f"{self.path}.tmp"
        with private(tmp, os.O_TRUNC) as f:
            f.writelines(lines)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        sync_directory(os.path.dirname(self.path))  # the rename itself survives a power loss
        if self.file is not None:
            self.file.close()
        self.file = private(self.path, os.O_APPEND)  # held open: one append per change
        self.state.lines, self.unsynced = len(lines), 0
        self.rewrites += 1


def private(path: str, flags: int):
    """``path`` opened for writing (text), readable and writable by its owner
    alone: made so, or made so if it was there (a file left by an older version)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | flags, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, "w", encoding="utf-8")


def sync_directory(path: str) -> None:
    fd = os.open(path or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class EngineLedger:
    """What changes in the hub's tables, told to the journal as it happens
    (by ``hubhooks`` and ``hostreg``), with the host that registered each
    engine (``host_of(heart)``): an engine filed, an id granted to one not
    beating yet, an engine dropped, a grant withdrawn."""

    def __init__(self, journal: EngineJournal, host_of, changed: Callable[[], None], loads=None):
        self.journal, self.host_of, self.changed = journal, host_of, changed
        self.loads = loads  # a ``placement.LeafLoads``, told too (None: no placement)

    def batch(self, commit: bool = False):
        """Changes made inside written as one (``EngineJournal.batch``); ``commit``:
        on disk before the caller answers."""
        return self.journal.batch(commit)

    def filed(self, ec) -> None:
        self._line(ec, "e")

    def granted(self, ec) -> None:
        self._line(ec, "g")

    def dropped(self, ec) -> None:
        self._line(ec, "d")
        if self.loads is not None:
            self.loads.gone(ec.id)

    def withdrawn(self, ec) -> None:
        self.journal.gone(ec.id)
        self.changed()
        if self.loads is not None:
            self.loads.gone(ec.id)

    def _line(self, ec, kind: str) -> None:
        self.journal.filed(ec.id, ec.uuid, self.host_of(ec.ident), kind)
        self.changed()
        if self.loads is not None and kind != "d":
            self.loads.live(ec.id)
