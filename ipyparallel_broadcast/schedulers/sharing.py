"""Which engines share this relay's memory, and each request's segment.

A relay greets each engine it serves (``ipb_hello``, idents ``[uuid, HELLO]``);
our engines answer with their shared-memory identity (``shm.identity``). An
engine whose identity is the relay's own is *local*: it can map what the relay
writes in ``/dev/shm``. Stock and simulated engines do not answer, and stay
remote. A greeting that cannot be delivered (the engine is not connected yet,
or hangs from another relay) is tried again when that engine next replies.

For a request whose buffers of ``store.threshold`` bytes or more go to local
engines, ``prepare`` writes them once (``store.put``); those engines get the
request with those buffers as empty frames and a ``shm.Reference`` ident.
The store is the only I/O: ``shm.ShmStore`` in a relay process, an in-memory
one in tests.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set

from .. import protocol as P
from .events import DOWN, Send

HELLO_KEY = P.HELLO_KEY.decode()


class Sharing:
    def __init__(self, codec: P.Codec, store=None):
        self.codec, self.store = codec, store
        self.local: Set[str] = set()  # engines that answered with our identity
        self.greeted: Set[str] = set()  # greeted, answer awaited (or never coming: stock)
        self.unreached: Set[str] = set()  # a greeting that could not be delivered
        self.bytes_shared = self.bytes_saved = self.segments = 0

    @property
    def on(self) -> bool:
        return self.store is not None and bool(getattr(self.store, "ident", ""))

    # -------------------------------------------------------------- greetings
    def greet(self, uuids) -> List[Send]:
        """Greet engines not greeted yet."""
        if not self.on:
            return []
        new = [u for u in uuids if u not in self.greeted]
        self.greeted.update(new)
        hello = self.codec.pack(P.HELLO, {})
        return [Send(DOWN, [u.encode(), P.HELLO_KEY] + hello) for u in new]

    def on_reply(self, uuid: str, key: str, body) -> List[Send]:
        """An engine replied (to anything): a greeting it missed goes again."""
        if key == HELLO_KEY:
            if not self.on:
                raise P.ProtocolError("a greeting's answer, but this relay greets no engine")
            content = self.codec.content(self.codec.unpack(body, content=False))
            if content.get("shm") == self.store.ident:
                self.local.add(uuid)
            return []
        if uuid in self.unreached:
            self.unreached.discard(uuid)
            self.greeted.discard(uuid)
            return self.greet([uuid])
        return []

    def joined(self, uuid: str, identity) -> List[Send]:
        """An engine told its identity as it joined (a host relay's): no greeting."""
        self.forget(uuid)
        self.greeted.add(uuid)
        if self.on and identity == self.store.ident:
            self.local.add(uuid)
        return []

    def undelivered(self, uuid: str):
        """A greeting's send failed: the engine is not connected here (yet)."""
        self.unreached.add(uuid)

    def forget(self, uuid: str):
        for known in (self.local, self.greeted, self.unreached):
            known.discard(uuid)

    # --------------------------------------------------------------- requests
    def prepare(self, p, targets, engines: Dict[int, str]) -> None:
        """Write ``p``'s big buffers once if local engines among ``targets`` get it
        (engines are looked at only for a request with big buffers)."""
        if not self.on or p.rename is not None or p.shared is not None:
            return
        big = [(i, b) for i, b in enumerate(p.inner[5:]) if P.nbytes(b) >= self.store.threshold]
        if not big:
            return
        readers = [engines[e] for e in targets if engines.get(e) in self.local]
        if not readers:
            return
        ref = self.store.put(big, len(readers))
        if ref is None:
            return
        nbytes = sum(P.nbytes(b) for _, b in big)
        self.segments += 1
        self.bytes_shared += nbytes
        self.bytes_saved += nbytes * (len(readers) - 1)
        replaced = {5 + i for i, _ in big}
        inner = [b"" if k in replaced else f for k, f in enumerate(p.inner)]
        p.shared = (ref, ref.frame(self.codec.sign), inner, set(readers))

    def frames_for(self, p, uuid: str, key: bytes) -> Optional[list]:
        """What ``uuid`` gets for ``p`` through shared memory, if it does."""
        if p.shared is None or uuid not in p.shared[3]:
            return None
        _, ident, inner, _ = p.shared
        return [uuid.encode(), key, ident, P._DELIM] + inner

    def release(self, p):
        """``p`` is done here: its segment's name goes."""
        if p.shared is not None:
            self.store.drop(p.shared[0])

    def stats(self) -> Dict[str, int]:
        return dict(shm_local=len(self.local), shm_segments=self.segments,
                    shm_bytes=self.bytes_shared, shm_saved=self.bytes_saved)

