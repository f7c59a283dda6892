"""One copy per host: big request buffers in shared memory, mapped by engines.

The first relay of a host to see a request (the controller's root for engines
on its host, or a host relay) writes each buffer of at least ``THRESHOLD``
bytes once into a segment, a file in ``/dev/shm``; relays below it on that host
get the segment's name in the request's content, and the engines a small
signed reference instead of the bytes (an ident frame, see ``Reference``).
Each engine maps every buffer copy-on-write (``MAP_PRIVATE``): it can write to
its array, and no other engine sees the write.

Nothing leaks:
- the relay that wrote a segment unlinks its name when the request is done at
  its level, whatever happened (an engine that died before mapping it); a
  segment a leaf wrote for its own engines also counts them down in its first
  page, and the last to map it unlinks the name at once;
- the memory goes back when the last engine drops the value (the mapping
  lives as long as the array over it);
- a name carries its relay's uid and pid, and a random part: relays when they
  start, and the controller when its relays stop, remove the names of relays
  that are no longer alive (``sweep``), so a SIGKILLed relay's segment goes
  when it is restarted or the cluster stops.

The way back, for a client on the engines' host (``share_reply``): an engine
writes its reply's big buffers once into a segment named for the client (its
uid, pid and a token of its own), and the client reads it once and unlinks the name
(the last reader of one); relays carry the name, not the bytes. A name the
client never gets (its call failed, the client died) goes when the client
closes, or, the client's pid gone, at the next sweep.

Used by relays (``ShmStore``), engines (``map_reference``, ``share_reply``) and
clients (``read_reply``, ``drop_prefix``); imports no NumPy.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import mmap
import os
import re
import secrets
import struct
from collections.abc import Sequence
from contextlib import contextmanager

from ..wire import protocol as P

log = logging.getLogger(__name__)

THRESHOLD = 1 << 20  # buffers of 1 MiB or more are shared (BroadcastController.shared_memory_threshold)
MARK = b"ipb-shm "  # an ident frame that starts so is a Reference
PAGE = mmap.PAGESIZE
_COUNT = struct.Struct("<q")  # the header: engines yet to map the segment
HELD = 1 << 62  # the count of a segment that only its writer unlinks (see ShmStore.put)
_MAX_IO = 1 << 30  # one pwrite or preadv at most (Linux moves at most ~2 GiB at once)


def directory() -> str:
    """Where segments live: ``IPB_SHM_DIR`` (tests), else ``/dev/shm``."""
    return os.environ.get("IPB_SHM_DIR", "/dev/shm")


def identity() -> str:
    """What tells this process's shared memory apart: its host (boot id and
    network namespace, as ``hostlink.host_label``), the shared-memory file
    system and the user. Hosts of a test bed share ``/dev/shm``; they are
    still different hosts."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        netns = os.stat("/proc/self/ns/net").st_ino
        st = os.stat(directory())
    except OSError:
        return ""  # nothing shared can be proven: never local
    return hashlib.sha1(f"{boot}:{netns}:{st.st_dev}:{st.st_ino}:{os.getuid()}".encode()).hexdigest()


def _prefix(pid: int) -> str:
    return f"ipb-shm-{os.getuid()}-{pid}-"


REPLY_THRESHOLD = 1 << 18  # a client's default: reply buffers of 256 KiB or more (Client.shared_reply_threshold)
_REPLY_PREFIX = re.compile(r"ipb-shm-[0-9]+-[0-9]+-[0-9a-f]{8}-\Z")


_RELAY_PREFIX = re.compile(r"ipb-shm-[0-9]+-[0-9]+-\Z")


def relay_prefix() -> str:
    """This relay's prefix for the names of its segments (and of the reduce
    values engines of its host leave for it: ``value_writer``)."""
    return _prefix(os.getpid())


def is_reply_prefix(prefix) -> bool:
    """Whether ``prefix`` is a client's (``reply_prefix``)."""
    return isinstance(prefix, str) and _REPLY_PREFIX.match(prefix) is not None


def is_relay_prefix(prefix) -> bool:
    """Whether ``prefix`` is a relay's (``relay_prefix``), as a greeting tells it."""
    return isinstance(prefix, str) and _RELAY_PREFIX.match(prefix) is not None


def reply_identity() -> str:
    """``identity()`` and the pid namespace: an engine writes a client's reply
    segments only where the pid in their names means that client ("" if unknown)."""
    base = identity()
    try:
        return base and f"{base}:{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return ""


def reply_prefix() -> str:
    """A new client's prefix for the names of its reply segments."""
    return _prefix(os.getpid()) + secrets.token_hex(4) + "-"


class ShmError(OSError):
    """A reference that cannot be mapped (its segment is gone, or it is malformed)."""


# ----------------------------------------------------------------- references
class Reference:
    """The ident frame that stands for a request's shared buffers:
    ``MARK + signature + b" " + JSON {name, bufs: [[index, offset, nbytes]]}``;
    the signature is the session's HMAC over the JSON, made once per request."""

    def __init__(self, name: str, bufs: Sequence[tuple[int, int, int]]):
        self.name, self.bufs = name, [tuple(b) for b in bufs]

    def content(self) -> dict:
        """As a relay passes it to a child relay of its host, in a signed request's content."""
        return dict(name=self.name, bufs=self.bufs)

    def frame(self, sign) -> bytes:
        payload = json.dumps(self.content(), separators=(",", ":")).encode()
        return MARK + sign([payload]) + b" " + payload

    @classmethod
    def parse(cls, frame: bytes, sign) -> Reference:
        import hmac

        head, sep, payload = frame[len(MARK) :].partition(b" ")
        if not sep or not hmac.compare_digest(head, sign([payload])):
            raise ShmError(errno.EPERM, "shared-memory reference with a bad signature")
        try:
            return cls.from_content(json.loads(payload))
        except ValueError as e:
            raise ShmError(errno.EINVAL, f"malformed shared-memory reference: {e}") from e

    @classmethod
    def from_content(cls, d) -> Reference:
        try:
            name, bufs = d["name"], [(int(i), int(o), int(n)) for i, o, n in d["bufs"]]
        except (ValueError, KeyError, TypeError) as e:
            raise ShmError(errno.EINVAL, f"malformed shared-memory reference: {e}") from e
        if not isinstance(name, str) or not name.startswith("ipb-shm-") or "/" in name:
            raise ShmError(errno.EINVAL, f"not a segment name: {name!r}")
        return cls(name, bufs)


def is_reference(frame) -> bool:
    return bytes(frame[: len(MARK)]) == MARK


# --------------------------------------------------------------- relay's side
class ShmStore:
    """A relay's segments: written once, named for its process, swept."""

    def __init__(self, root: str | None = None, threshold: int = THRESHOLD):
        self.root, self.threshold = root or directory(), threshold
        self.ident = identity()
        self.failed_once = False

    @property
    def prefix(self) -> str:
        return relay_prefix()

    def put(self, buffers: Sequence, readers: int = HELD, prefix: str | None = None) -> Reference | None:
        """Write ``buffers`` (index, bytes-like) in one new segment that
        ``readers`` engines will map (the last unlinks it); by default, as many
        as the relays below want, and only this relay unlinks it (``drop``).
        ``prefix``: its name's, if not this process's. None (and a log line,
        once) if shared memory cannot take it."""
        made = self._create([(index, memoryview(buf).nbytes) for index, buf in buffers], readers, prefix)
        if made is None:
            return None
        ref, fd, path = made
        try:
            for (_, off, _n), (_, buf) in zip(ref.bufs, buffers):
                _write_all(fd, memoryview(buf).cast("B"), off)
        except OSError as e:
            _unlink(path)
            return self._fall_back(e)
        finally:
            os.close(fd)
        return ref

    def reserve(
        self, sizes: Sequence[tuple[int, int]], allocate: bool = True
    ) -> tuple[Reference, list[memoryview]] | None:
        """A new segment for buffers of ``sizes`` ((index, nbytes)) that only
        this relay unlinks, mapped writable here: the views to fill (chunks
        arriving, see ``relay.dataplane``). None if shared memory cannot take it.
        Not ``allocate``: its pages come as they are first written, by
        ``write`` (which then fails with ENOSPC, where a mapping would get SIGBUS)."""
        made = self._create(sizes, HELD, allocate=allocate)
        if made is None:
            return None
        ref, fd, path = made
        try:
            views = [
                memoryview(mmap.mmap(fd, n, offset=off)) if n else memoryview(bytearray()) for _, off, n in ref.bufs
            ]
        except OSError as e:
            _unlink(path)
            return self._fall_back(e)
        finally:
            os.close(fd)
        return ref, views

    def _create(self, sizes, readers: int, prefix: str | None = None, allocate: bool = True):
        """(reference, open descriptor, path) of a new segment laid out for
        ``sizes``, its space reserved and its count written."""
        name = (prefix or _prefix(os.getpid())) + secrets.token_hex(8)
        path = os.path.join(self.root, name)
        layout, offset = [], PAGE  # the first page holds the count
        for index, n in sizes:
            layout.append((index, offset, n))
            offset += -(-n // PAGE) * PAGE
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except OSError as e:
            return self._fall_back(e)
        try:
            if allocate:
                os.posix_fallocate(fd, 0, offset)  # ENOSPC now, not SIGBUS in an engine later
            else:
                os.ftruncate(fd, offset)
            os.pwrite(fd, _COUNT.pack(readers), 0)
        except OSError as e:
            os.close(fd)
            _unlink(path)
            return self._fall_back(e)
        return Reference(name, layout), fd, path

    def map(self, ref: Reference) -> list[tuple[int, memoryview]]:
        """A segment a parent relay of this host wrote, mapped read-only to
        send its buffers on from: ``[(index, view)]``. Raises ``ShmError``."""
        return map_reference(ref, self.root, engine=False)

    def take_value(self, content) -> memoryview:
        """A reduce value left in a segment named for this relay (by a host fold
        of its engines, or a child relay of its host that passed it up:
        ``pass_value``), mapped shared and writable. Raises ``ShmError``."""
        ref = Reference.from_content(content)
        if not ref.name.startswith(self.prefix) or len(ref.bufs) != 1:
            raise ShmError(errno.EINVAL, f"not a reduce value for this relay: {ref.name}")
        path = os.path.join(self.root, ref.name)
        ((_, view),) = _mapped(ref, path, mmap.MAP_SHARED | _POPULATE, mmap.PROT_READ | mmap.PROT_WRITE)
        return view

    def pass_value(self, content, prefix: str) -> dict:
        """Rename a value's segment for its next reader (a relay or client of
        this host whose names start with ``prefix``): its reference there.
        Should that reader die first, the name goes with its (``sweep``)."""
        ref = Reference.from_content(content)
        name = prefix + secrets.token_hex(8)
        os.rename(os.path.join(self.root, ref.name), os.path.join(self.root, name))
        return Reference(name, ref.bufs).content()

    def drop(self, ref: Reference):
        """The request is done here: the name goes (mappings keep the memory)."""
        _unlink(os.path.join(self.root, ref.name))

    def _fall_back(self, e: OSError) -> None:
        if not self.failed_once:
            self.failed_once = True
            log.warning(
                "shared memory in %s cannot take a request (%s): engines of this host "
                "get their own copies instead (logged once)",
                self.root,
                e,
            )
        return None


def _write_all(fd: int, view: memoryview, offset: int):
    done = 0
    while done < view.nbytes:
        done += os.pwrite(fd, view[done : done + _MAX_IO], offset + done)


def _unlink(path: str):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def sweep(root: str | None = None) -> list[str]:
    """Remove this user's segments whose relay is no longer alive; their names."""
    root = root or directory()
    head = f"ipb-shm-{os.getuid()}-"
    gone = []
    try:
        names = os.listdir(root)
    except OSError:
        return gone
    for name in names:
        if not name.startswith(head):
            continue
        try:
            pid = int(name[len(head) :].split("-", 1)[0])
        except ValueError:
            continue
        if not pid_alive(pid):
            _unlink(os.path.join(root, name))
            gone.append(name)
    return gone


def remove(name: str, root: str | None = None):
    """Remove one segment's name, if it is still there."""
    _unlink(os.path.join(root or directory(), name))


def drop_prefix(prefix: str, root: str | None = None) -> list[str]:
    """Remove every segment whose name starts with ``prefix`` (a closing client's); their names."""
    root = root or directory()
    try:
        names = [n for n in os.listdir(root) if n.startswith(prefix)]
    except OSError:
        return []
    for name in names:
        _unlink(os.path.join(root, name))
    return names


def pid_alive(pid) -> bool:
    """Whether process ``pid`` runs (another user's counts; None, junk or a
    zombie, which has exited but is not yet reaped, does not)."""
    try:
        pid = int(pid)
        os.kill(pid, 0)
    except PermissionError:
        pass
    except (OSError, TypeError, ValueError):
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[:1] != [b"Z"]
    except OSError:
        return True  # no /proc here (macOS): it exists


# -------------------------------------------------------------- engine's side
def map_reference(ref: Reference, root: str | None = None, engine: bool = True) -> list[tuple[int, memoryview]]:
    """Map each buffer of ``ref`` copy-on-write: ``[(index, writable view)]``.
    The last engine to map the segment unlinks its name. Not ``engine`` (a
    relay): read-only, and not counted."""
    path = os.path.join(root or directory(), ref.name)
    if engine:
        views = _mapped(ref, path, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
        _count_down(path)
        return views
    return _mapped(ref, path, mmap.MAP_SHARED, mmap.PROT_READ)


def _host_value(content, prefix: str, nbytes: int) -> tuple[Reference, str]:
    ref = Reference.from_content(content)
    if not ref.name.startswith(prefix) or len(ref.bufs) != 1 or ref.bufs[0][2] != nbytes:
        raise ShmError(errno.EINVAL, f"not a segment of this engine's relay for {nbytes} bytes: {ref.name}")
    return ref, os.path.join(directory(), ref.name)


def map_host_value(content, prefix: str, nbytes: int, lo: int = 0, hi: int | None = None) -> memoryview:
    """An engine's: the segment its relay made for the reduce value of its
    host's engines (``ShmStore.reserve``), mapped shared and writable, to
    combine its own value into in its turn: bytes ``lo`` to ``hi`` of the
    value (default: all). Only a segment of that relay (``prefix``) of
    ``nbytes``, written there already (``write_host_value``). Raises ``ShmError``."""
    ref, path = _host_value(content, prefix, nbytes)
    hi = nbytes if hi is None else hi
    _check_range(ref, lo, hi, nbytes)
    offset = ref.bufs[0][1] + lo
    start = offset - offset % PAGE  # (a mapping starts on a page)
    part = Reference(ref.name, [(0, start, offset + (hi - lo) - start)])
    ((_, view),) = _mapped(part, path, mmap.MAP_SHARED | _POPULATE, mmap.PROT_READ | mmap.PROT_WRITE)
    return view[offset - start :]


def write_host_value(content, prefix: str, data, lo: int = 0, nbytes: int | None = None) -> None:
    """An engine's, the first in turn: its value's bytes (``data``: those from
    ``lo`` on, of a value of ``nbytes``) into that segment (written, not
    mapped: its pages are new, and a write is the cheapest way to fill them;
    a full file system is ENOSPC here, never SIGBUS later). Raises ``ShmError``."""
    view = memoryview(data).cast("B")
    nbytes = view.nbytes if nbytes is None else nbytes
    ref, path = _host_value(content, prefix, nbytes)
    _check_range(ref, lo, lo + view.nbytes, nbytes)
    with _opened(ref, path, os.O_RDWR, "written") as fd:
        if os.fstat(fd).st_size < ref.bufs[0][1] + nbytes:
            raise ShmError(errno.EINVAL, f"segment {ref.name} is too small for the value")
        _write_all(fd, view, ref.bufs[0][1] + lo)


def _check_range(ref: Reference, lo, hi, nbytes: int) -> None:
    if not (type(lo) is int and type(hi) is int and 0 <= lo < hi <= nbytes):
        raise ShmError(errno.EINVAL, f"bytes {lo!r} to {hi!r} of a {nbytes}-byte value in {ref.name}")


def take_value(ref: Reference, root: str | None = None) -> memoryview:
    """A client's: a reduce's value the root left in a segment named for it,
    mapped shared and writable at once (every page), its name unlinked (the
    client is its one reader). Raises ``ShmError``."""
    path = os.path.join(root or directory(), ref.name)
    try:
        ((_, view),) = _mapped(ref, path, mmap.MAP_SHARED | _POPULATE, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        _unlink(path)
    return view


def read_reply(ref: Reference, take, root: str | None = None) -> list[tuple[int, memoryview]]:
    """A client's: read each buffer of a reply segment (``share_reply``) into
    ``take(nbytes)``, a writable buffer of that size (one copy, into memory
    whose pages are already there, with the GIL released; mapping the segment
    faults in a page at a time, holding it), and unlink its name (the client is
    its one reader). ``[(index, view)]``. Raises ``ShmError``."""
    path = os.path.join(root or directory(), ref.name)
    views = []
    with _opened(ref, path, os.O_RDONLY, "read") as fd:
        _unlink(path)
        size = os.fstat(fd).st_size
        for index, offset, n in ref.bufs:
            if offset % PAGE or offset < PAGE or n < 0 or offset + n > size:
                raise ShmError(errno.EINVAL, f"buffer {index} lies outside segment {ref.name}")
            view = take(n)
            done = 0
            while done < n:
                got = os.preadv(fd, [view[done : done + _MAX_IO]], offset + done)
                if got <= 0:
                    raise ShmError(errno.EIO, f"segment {ref.name} ended inside buffer {index}")
                done += got
            views.append((index, view))
    return views


@contextmanager
def _opened(ref: Reference, path: str, flags: int, doing: str):
    """A segment's descriptor, closed after; any ``OSError`` meanwhile as a ``ShmError``."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW)
    except OSError as e:
        raise ShmError(e.errno, f"shared-memory segment {ref.name} is gone: {e.strerror}") from e
    try:
        yield fd
    except ShmError:
        raise
    except OSError as e:
        raise ShmError(e.errno, f"shared-memory segment {ref.name} cannot be {doing}: {e.strerror}") from e
    finally:
        os.close(fd)


_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # (Linux) map every page at once: no fault per 4 KiB as it is read


def _mapped(ref: Reference, path: str, flags: int, prot: int) -> list[tuple[int, memoryview]]:
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    except OSError as e:
        raise ShmError(e.errno, f"shared-memory segment {ref.name} is gone: {e.strerror}") from e
    try:
        size = os.fstat(fd).st_size
        views = []
        for index, offset, n in ref.bufs:
            if offset % PAGE or offset < PAGE or offset + n > size:
                raise ShmError(errno.EINVAL, f"buffer {index} lies outside segment {ref.name}")
            if n == 0:
                views.append((index, memoryview(bytearray())))
                continue
            mm = mmap.mmap(fd, n, flags=flags, prot=prot, offset=offset)
            views.append((index, memoryview(mm)))  # the view keeps the mapping alive
    finally:
        os.close(fd)  # each mapping keeps a duplicate (an engine's count is locked through another)
    return views


def _count_down(path: str):
    """One engine fewer to map the segment; the last one unlinks its name."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    except FileNotFoundError:
        return  # the relay was done with it first
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released by close
        (left,) = _COUNT.unpack(os.pread(fd, _COUNT.size, 0))
        os.pwrite(fd, _COUNT.pack(left - 1), 0)
        if left <= 1:
            _unlink(path)
    finally:
        os.close(fd)


def reference_in(frames: Sequence) -> int | None:
    """The position of a ``Reference`` among the idents of ``frames``, if any."""
    for i, frame in enumerate(frames):
        data = P.as_bytes(frame) if len(frame) <= 4096 else b""
        if data == P._DELIM:
            return None
        if data.startswith(MARK):
            return i
    return None


def expand(frames: list, at: int, sign) -> list:
    """``frames`` as an engine received them, with the ``Reference`` ident at
    ``at`` removed and the buffers it names mapped in place of their (empty)
    frames. Raises ``ShmError``."""
    ref = Reference.parse(P.as_bytes(frames[at]), sign)
    rest = frames[:at] + frames[at + 1 :]
    delim = next((k for k, f in enumerate(rest) if len(f) == len(P._DELIM) and P.as_bytes(f) == P._DELIM), None)
    if delim is None:
        raise ShmError(errno.EINVAL, "a shared-memory reference in a message without a delimiter")
    first = 1 + 5 + delim
    if any(first + index >= len(rest) for index, _, _ in ref.bufs):
        raise ShmError(errno.EINVAL, "a shared-memory reference names a buffer the request lacks")
    for index, view in map_reference(ref):
        rest[first + index] = view  # after the signature and the four JSON frames
    return rest


_replies: list[ShmStore] = []  # an engine's store of its replies' segments, made at first use
_here: list[str] = []  # its reply_identity(), read at first use


def share_reply(buffers: list, spec, md: dict, here: str | None = None) -> list:
    """An engine's reply buffers for a client that asked for big ones in shared
    memory (``spec``: its ``[reply_identity(), reply_prefix(), threshold]``):
    when the client is on this host (``here``, by default this process's
    ``reply_identity()``), those of ``threshold`` bytes or more are written once
    into a segment named with the client's prefix, for one reader (the client),
    and travel as empty frames; the reply's metadata ``md`` names the segment
    (``SHM_KEY``). The buffers to send."""
    if here is None:
        if not _here:
            _here.append(reply_identity())
        here = _here[0]
    try:
        where, prefix, threshold = spec
    except (TypeError, ValueError):
        return buffers
    if not here or where != here or type(threshold) is not int or threshold <= 0:
        return buffers
    big = [(i, b) for i, b in enumerate(buffers) if memoryview(b).nbytes >= threshold]
    if not big or not isinstance(prefix, str) or not _REPLY_PREFIX.match(prefix):  # (most replies: no big buffer)
        return buffers
    if not _replies or _replies[0].root != directory():
        _replies[:] = [ShmStore()]
    ref = _replies[0].put(big, readers=1, prefix=prefix)
    if ref is None:
        return buffers
    out = list(buffers)
    for i, _ in big:
        out[i] = b""
    md[P.SHM_KEY] = ref.content()
    return out
