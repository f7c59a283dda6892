"""What a relay node's parts are given of it: never the node itself."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..wire import protocol as P
from .events import Send


@dataclass(frozen=True)
class NodeContext:
    codec: P.Codec  # signs, checks and packs messages
    clock: Callable[[], float]  # monotonic seconds
    name: str  # as logs and stats name the node ("node 0.1", "host h3")
    boot: str  # this process's life: a restart changes it
    is_root: bool
    host: str | None  # a host relay's label (None: a node of the tree)
    drop: Callable[[str], list[Send]]  # a malformed or unexpected message: counted, logged, no sends
