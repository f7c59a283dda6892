"""Link ends, written once for every transport: the leaf's word that ends a
request's links at its hosts (``CHAIN_END``: a reduce's chain or trees, an
allreduce's ring), and the keys a host keeps of what ended there (the
newest ones), so that what still comes for them is dropped quietly."""

from __future__ import annotations

from collections.abc import Iterable

from ...wire import protocol as P
from ..events import DOWN, Send

KEPT = 256  # ended keys a host keeps


def end_links(codec: P.Codec, key: str, hosts: Iterable[bytes], why: str | None = None, but=None) -> list[Send]:
    """Tell ``hosts`` (but ``but``, gone) to let go of request ``key``'s links."""
    content = dict(keys=[key]) if why is None else dict(keys=[key], why=why)
    end = codec.pack(P.CHAIN_END, content)
    return [Send(DOWN, [host] + end) for host in hosts if host != but]


class Ended(dict):
    """Keys of links (or rings) that ended here, and why: the newest ``limit``."""

    def __init__(self, limit: int = KEPT):
        super().__init__()
        self.limit = limit

    def add(self, key: str, why: str | None = None) -> None:
        self[key] = why
        while len(self) > self.limit:
            self.pop(next(iter(self)))
