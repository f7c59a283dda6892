"""The broadcast replies an engine keeps until its client has them, sans I/O.

A controller that dies takes its relay nodes with it, and any reply on its
way up through them. Once the controller is back, our client sends each call
it is still owed again, with the same msg_id (``client/replies.py``). The
engine answers such a copy with the reply it kept, under the copy's route, and
never runs a request twice.

Each request of our client carries two numbers in its metadata: the call's
own (``ipb_seq``) and the lowest one the client is still owed (``ipb_owed``).
Its replies to calls below that have reached it, and are let go: the client's
acknowledgement rides on its next request, at no cost of its own.

Bounded: at most ``most`` replies and ``most_bytes`` bytes of their buffers
(a reply bigger than that is not kept); the oldest go first, counted in
``let_go``. A copy of a request whose reply is not here is answered with an
error that says why (``missing``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from ..wire import protocol as P
from ..wire.protocol import OWED_KEY, SEQ_KEY


class KeptReplies:
    """The replies to our client's broadcasts, by ``(session, msg_id)`` of their
    request; ``seen`` remembers those of the last ``4 * most`` requests
    (answered or not). The sender's session is part of the key: an
    allreduce's second half comes from the root with the call's msg_id, and
    is a request of its own."""

    def __init__(self, most: int = 1024, most_bytes: int = 64 << 20):
        self.most, self.most_bytes = most, most_bytes
        # (session, msg_id) -> (client, seq, frames, bytes)
        self.replies: OrderedDict[tuple, tuple[str, int, list, int]] = OrderedDict()
        self.by_client: dict[str, OrderedDict[int, tuple]] = {}  # client session -> seq -> key, kept ones
        self.seen: OrderedDict[tuple, None] = OrderedDict()
        self.nbytes = 0
        self.let_go = 0  # replies dropped by the bounds before their client had them
        self.resent = 0  # copies answered from here

    def arrived(self, msg_id: str, header: dict, metadata: dict) -> bool:
        """A broadcast request came: True if it is new (and what its client has is
        let go); False if it is a copy of one this engine has had."""
        key = (header.get("session"), msg_id)
        if key in self.seen:
            return False
        self.seen[key] = None
        if len(self.seen) > 4 * self.most:
            self.seen.popitem(last=False)
        owed, client = metadata.get(OWED_KEY), header.get("session")
        if type(owed) is int and client in self.by_client:
            self._acknowledged(client, owed)
        return True

    def keep(self, msg_id: str, header: dict, metadata: dict, frames: Sequence) -> bool:
        """Keep the reply ``frames`` (signed parts and buffers, no idents) to a
        request of our client; False if it is not kept (not one of ours, or too big)."""
        seq, client = metadata.get(SEQ_KEY), header.get("session")
        if type(seq) is not int or not isinstance(client, str):
            return False
        size = sum(P.nbytes(f) for f in frames[5:])
        if size > self.most_bytes:
            return False
        self.replies[(client, msg_id)] = (client, seq, list(frames), size)
        self.by_client.setdefault(client, OrderedDict())[seq] = (client, msg_id)
        self.nbytes += size
        while len(self.replies) > self.most or self.nbytes > self.most_bytes:
            self._drop(next(iter(self.replies)))
            self.let_go += 1
        return True

    def again(self, msg_id: str, session) -> list | None:
        """The kept reply to a copy of ``msg_id`` from ``session`` (its frames, no idents), or None."""
        kept = self.replies.get((session, msg_id))
        if kept is None:
            return None
        self.resent += 1
        return kept[2]

    def missing(self, msg_id: str, session) -> str:
        """Why a copy of ``msg_id`` from ``session`` cannot be answered from here."""
        if (session, msg_id) in self.seen:
            return "its reply was not kept (too big, or let go for newer ones), and it is not run twice"
        return "it came again, and is not run twice"

    def _acknowledged(self, client: str, owed: int):
        seqs = self.by_client[client]
        while seqs:
            seq, key = next(iter(seqs.items()))
            if seq >= owed:
                break
            self._drop(key)

    def _drop(self, key: tuple):
        client, seq, _, size = self.replies.pop(key)
        self.nbytes -= size
        seqs = self.by_client[client]
        seqs.pop(seq, None)
        if not seqs:
            del self.by_client[client]
