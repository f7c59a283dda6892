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
Above the leaves of the controller's tree, whose relays share one host, the
first relay writes them (``pass_down``) and the ones below pass the reference
on in the request's content (``take``): one segment per host, whatever the
tree's shape.
The store is the only I/O: ``shm.ShmStore`` in a relay process, an in-memory
one in tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..wire import protocol as P
from .events import DOWN, Send

HELLO_KEY = P.HELLO_KEY.decode()


@dataclass
class Shared:
    """A request's big buffers in a segment, at one relay."""

    ref: object  # shm.Reference
    inner: list  # the request's frames, those buffers empty
    owner: bool  # this relay wrote it, and unlinks it
    counted: bool  # its engines count down (a leaf's, for the engines it first sent to)
    nbytes: int
    readers: set[str] = field(default_factory=set)  # engines here that map it
    _ident: bytes | None = None

    def ident(self, sign) -> bytes:
        """The signed reference an engine gets as an ident frame (signed once)."""
        if self._ident is None:
            self._ident = self.ref.frame(sign)
        return self._ident

    def content(self) -> dict:
        return self.ref.content()


class Sharing:
    def __init__(self, codec: P.Codec, store=None):
        self.codec, self.store = codec, store
        self.local: set[str] = set()  # engines that answered with our identity
        self.greeted: set[str] = set()  # greeted, answer awaited (or never coming: stock)
        self.unreached: set[str] = set()  # a greeting that could not be delivered
        self.bytes_shared = self.bytes_saved = self.segments = 0
        self.values_taken = 0  # reduce values engines of this host combined in shared memory
        self.reply_ident = None  # shm.reply_identity(), once a client's spec is checked against it
        # an attribute, not a property: read on every reply (no call into this module)
        self.on = store is not None and bool(getattr(store, "ident", ""))
        self.threshold = store.threshold if self.on else None  # a buffer this big is shared

    # -------------------------------------------------------------- greetings
    def greet(self, uuids) -> list[Send]:
        """Greet engines not greeted yet."""
        if not self.on:
            return []
        new = [u for u in uuids if u not in self.greeted]
        self.greeted.update(new)
        # who greets: an engine of this host keeps its reduce values of
        # ``threshold`` or more, to combine them into this relay's segment (``hostfold``)
        hello = self.codec.pack(P.HELLO, dict(shm=self.store.ident, prefix=self.store.prefix, threshold=self.threshold))
        return [Send(DOWN, [u.encode(), P.HELLO_KEY] + hello) for u in new]

    def on_reply(self, uuid: str, key: str, body) -> list[Send]:
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

    def joined(self, uuid: str, identity) -> list[Send]:
        """An engine told its identity as it joined (a host relay's); one of
        this host is greeted all the same, to learn where its values go."""
        self.forget(uuid)
        if self.on and identity == self.store.ident:
            self.local.add(uuid)
            return self.greet([uuid])
        self.greeted.add(uuid)
        return []

    def value_segment(self, nbytes: int):
        """A new segment for the value the engines of this host combine
        (``hostfold``): ``(reference content, writable view)``, or None if shared
        memory cannot take it."""
        if not self.on:
            raise P.ProtocolError("engines hold values for this relay, but it shares no memory")
        made = self.store.reserve([(0, nbytes)], allocate=False)  # the first engine writes it whole
        if made is None:
            return None
        ref, (view,) = made
        return ref.content(), view

    def take_value(self, content):
        """A value left in a segment named for this relay, mapped writable
        (its name stays until the request is done here: ``drop_value``).
        Raises ``OSError`` (``shm.ShmError``)."""
        if not self.on:
            raise P.ProtocolError("a value in shared memory, but this relay shares none")
        return self.store.take_value(content)

    def drop_value(self, content) -> None:
        """A value's segment: its name goes, if it is still here (the mappings keep the memory)."""
        from ..host.shm import Reference  # imported by relays that have a store only

        self.store.drop(Reference.from_content(content))

    def value_taker(self, p):
        """How request ``p``'s children of this host hand up values in
        segments: mapped, and named in ``p.segments`` (None: no sharing)."""
        if not self.on:
            return None

        def take(content):
            view = self.take_value(content)
            p.segments.append(content)
            return view

        return take

    def values_combined(self, count: int) -> None:
        """``count`` engines' reduce values were combined in a segment of this host (``hostfold``)."""
        self.values_taken += count

    def drop_values(self, p) -> None:
        """``p`` is done here: the names of the segments its values were in
        go (those passed up are the reader's now)."""
        for content in p.segments:
            self.drop_value(content)

    def passer(self, spec, client: bool):
        """How a value in one of this relay's segments goes up to the reader
        ``spec`` names (``[host, prefix, threshold]``: a client of this host,
        or the parent relay, always of this host): renamed for it; None if
        that reader does not share this host's memory."""
        from ..host import shm  # imported by relays that have a store only

        if not self.on or not isinstance(spec, list) or len(spec) != 3:
            return None
        host, prefix, threshold = spec
        if self.reply_ident is None:
            self.reply_ident = shm.reply_identity()
        if client and not (host and host == self.reply_ident and shm.is_reply_prefix(prefix)):
            return None
        if not client and not shm.is_relay_prefix(prefix):
            return None

        def share(segment):
            if segment["bufs"][0][2] < threshold:
                return None
            try:
                return self.store.pass_value(segment, prefix)
            except OSError:
                return None  # (the reader gets the bytes)

        return share

    def undelivered(self, uuid: str):
        """A greeting's send failed: the engine is not connected here (yet)."""
        self.unreached.add(uuid)

    def forget(self, uuid: str):
        for known in (self.local, self.greeted, self.unreached):
            known.discard(uuid)

    # --------------------------------------------------------------- requests
    def pass_down(self, p) -> None:
        """A relay with child relays on its host (the controller's tree above
        its leaves) writes ``p``'s big buffers once, and they pass the segment
        on instead of the bytes. Only this relay unlinks it, when ``p`` is done
        here: by then every engine below has mapped it or is gone."""
        big = self._big(p)
        ref = self.store.put(big) if big else None
        if ref is not None:
            self.adopt(p, ref, big)

    def take(self, p, content) -> None:
        """A request whose big buffers the parent passed as a segment: they are
        mapped read-only here, for engines and host relays that get bytes.
        Raises ``shm.ShmError`` (the segment is gone or the reference malformed)."""
        from ..host.shm import Reference  # imported by relays that have a store only

        if self.store is None:
            raise P.ProtocolError("a shared-memory reference, but this relay has no shared memory")
        ref = Reference.from_content(content)
        views = dict(self.store.map(ref))
        if any(not 0 <= i < len(p.inner) - 5 for i in views):
            raise P.ProtocolError("a shared-memory reference names a buffer the request lacks")
        big = [(i, views[i]) for i in sorted(views)]
        p.inner = [views.get(k - 5, f) for k, f in enumerate(p.inner)]
        p.shared = self._shared(p, ref, big, owner=False)

    def adopt(self, p, ref, big) -> None:
        """``p``'s big buffers were assembled in a segment here (``bulk``):
        its local engines map it, and this relay unlinks it when ``p`` is done."""
        p.shared = self._shared(p, ref, big, owner=True)
        self.segments += 1
        self.bytes_shared += p.shared.nbytes

    def adopt_value(self, p, content, index: int) -> None:
        """``p`` (an allreduce's second half) carries, as its buffer ``index``,
        a value that lives in the segment ``content`` here: engines map that
        segment, no copy is made, and this relay unlinks it when ``p`` is done."""
        from ..host.shm import Reference  # imported by relays that have a store only

        ref = Reference.from_content(content)
        (_, offset, n), buf = ref.bufs[0], p.inner[5 + index]
        self.adopt(p, Reference(ref.name, [(index, offset, n)]), [(index, buf)])

    def prepare(self, p, targets, engines: dict[int, str]) -> None:
        """Which of ``targets`` map ``p``'s big buffers: the local ones; the
        buffers are written once here unless a parent relay did (engines are
        looked at only for a request with big buffers)."""
        if not self.on or p.rename is not None:
            return
        if p.shared is None:
            big = self._big(p)
            n_readers = sum(engines.get(e) in self.local for e in targets) if big else 0
            ref = self.store.put(big, n_readers) if n_readers else None
            if ref is None:
                return
            p.shared = self._shared(p, ref, big, owner=True, counted=True)
            self.segments += 1
            self.bytes_shared += p.shared.nbytes
        elif p.shared.counted:  # its count is spent: later engines (parked ones) get copies
            return
        readers = [engines[e] for e in targets if engines.get(e) in self.local]
        p.shared.readers.update(readers)
        self.bytes_saved += p.shared.nbytes * len(readers)

    def frames_for(self, p, uuid: str, key: bytes) -> list | None:
        """What ``uuid`` gets for ``p`` through shared memory, if it does."""
        shared = p.shared
        if shared is None or uuid not in shared.readers:
            return None
        return [uuid.encode(), key, shared.ident(self.codec.sign), P._DELIM] + shared.inner

    def release(self, p):
        """``p`` is done here: the segment's name goes if this relay wrote it."""
        if p.shared is not None and p.shared.owner:
            self.store.drop(p.shared.ref)

    def _big(self, p) -> list:
        if self.store is None or p.rename is not None or p.stock or p.shared is not None:
            return []
        return [(i, b) for i, b in enumerate(p.inner[5:]) if P.nbytes(b) >= self.store.threshold]

    @staticmethod
    def _shared(p, ref, big, owner: bool, counted: bool = False) -> Shared:
        replaced = {5 + i for i, _ in big}
        inner = [b"" if k in replaced else f for k, f in enumerate(p.inner)]
        return Shared(ref, inner, owner, counted, sum(P.nbytes(b) for _, b in big))

    def stats(self) -> dict[str, int]:
        """``shm_bytes``: written to segments here; ``shm_saved``: the engine
        copies that mapping avoided here (a host saves the sum of its relays'
        ``shm_saved`` less that of their ``shm_bytes``); ``shm_values``: reduce
        values engines of this host combined into segments of this relay (``hostfold``)."""
        return dict(
            shm_local=len(self.local),
            shm_segments=self.segments,
            shm_bytes=self.bytes_shared,
            shm_saved=self.bytes_saved,
            shm_values=self.values_taken,
        )
