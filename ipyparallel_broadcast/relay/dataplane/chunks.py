"""Chunks, written once for every transport of the data plane (a push's
tree, a reduce's chain or trees, an allreduce's ring): how many a value
has, where each lies, how a value is cut into parts on chunk boundaries,
one assembly with one policy for a chunk that comes twice, and the check
every chunk message passes (its signature, its type, its bytes' digest),
and how a message goes to another host's chunk socket."""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Sequence

from ...wire import protocol as P
from ...wire.topology import host_ident
from ..events import Send

BULK = "bulk"  # a Send to a host relay's chunk socket: [url, identity, *message]; [url]: close the link
LINK = host_ident("chain")  # the identity a host's links to other hosts' chunk sockets go by


def count(nbytes: int, chunk: int) -> int:
    """How many chunks of ``chunk`` bytes ``nbytes`` take (none for none)."""
    return -(-nbytes // chunk)


def size(i: int, nbytes: int, chunk: int) -> int:
    """The bytes of chunk ``i`` of an ``nbytes`` value (the last may be short)."""
    return min(chunk, nbytes - i * chunk)


def piece(view: memoryview, i: int, chunk: int) -> memoryview:
    """Chunk ``i`` of the bytes ``view`` (a byte view: ``cast("B")``)."""
    return view[i * chunk : (i + 1) * chunk]


def cuts(nbytes: int, chunk: int, n: int) -> list[int]:
    """Where each of the ``n`` parts of an ``nbytes`` value starts (and the
    last ends), on chunk boundaries, as evenly as whole chunks allow."""
    chunks = count(nbytes, chunk)
    return [min(nbytes, (k * chunks // n) * chunk) for k in range(n + 1)]


def parts(nbytes: int, chunk: int, n: int) -> list[tuple[int, int]]:
    """The byte ranges ``(lo, hi)`` of the ``n`` parts (``cuts``)."""
    bounds = cuts(nbytes, chunk, n)
    return list(zip(bounds, bounds[1:]))


def digest(data) -> str:
    return hashlib.sha256(data).hexdigest()


def checked(codec: P.Codec, body, kind: str, what: str) -> dict:
    """A data plane's message of one chunk (a push's, a reduce chain's, a
    ring's): ``[sig, header, parent, metadata, content, data]``, signed, of
    type ``kind``, its bytes matching the digest its content gives; parsed."""
    if len(body) != 6:
        raise P.ProtocolError(f"a {what} has {len(body)} frames, needs 6")
    msg = codec.unpack(body)
    if msg["header"].get("msg_type") != kind or not isinstance(msg["content"], dict):
        raise P.ProtocolError(f"not a {what}")
    if digest(body[5]) != msg["content"].get("d"):
        raise P.ProtocolError(f"a {what} that does not match its digest")
    return msg


def to_host(url: str, frames: Sequence, ident: bytes = LINK) -> Send:
    """A message (its frames from the delimiter on) to the host whose chunk socket is ``url``."""
    return Send(BULK, [url.encode(), ident, *frames])


class Assembly:
    """Chunks written into place, each once. A chunk that comes again (a
    push's chunks sent anew after healing, or a peer's mistake) is not
    written: it is counted in ``duplicates`` and ``put`` says False."""

    def __init__(self):
        self.have: set[Hashable] = set()
        self.duplicates = 0

    def __len__(self) -> int:
        return len(self.have)

    def __contains__(self, key) -> bool:
        return key in self.have

    def put(self, key: Hashable, into, start: int, data) -> bool:
        """Write ``data`` at ``start`` of ``into`` (writable bytes) as chunk ``key``."""
        if key in self.have:
            self.duplicates += 1
            return False
        view = memoryview(data).cast("B")
        into[start : start + view.nbytes] = view
        self.have.add(key)
        return True
