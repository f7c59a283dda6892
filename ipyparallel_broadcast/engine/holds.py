"""Big reduce values an engine keeps where they are, until its relay has the
engines of its host combine theirs, one after another, into one segment.

A relay of this engine's host says in its greeting where its segments live
(its prefix) and from what size a value is big. Such a value is not copied
anywhere when ``f`` returns it: the engine keeps it (``hold``) and answers
with a token. Once every engine of the request on that host has answered, the
relay makes one segment of the value's size and gives the holders turns in
the order of their engine ids (``FOLD_TURN``): the first copies its value in,
each next one combines its own into it, on a few threads, at the host's
memory speed (``turn``; a turn may be for a stripe of the value, when the
host's value goes into a reduce chain stripe by stripe). Once the segment holds the host's value the relay
lets them go (``FOLD_RELEASE``). Until then the engine runs no other request
(``holding``): a later one could change the value it keeps. A greeting from
another relay (its own restarted) lets every value go.
"""

from __future__ import annotations

import logging
from itertools import count

from ..compat.pyzmq import Direct
from ..host import shm
from ..wire import protocol as P
from ..wire import reduction
from ..wire.reduction import OPS, combine_into, ufunc

log = logging.getLogger(__name__)


class Holds:
    """The big reduce values this engine keeps for its relay ``prefix``."""

    def __init__(self, prefix: str, threshold: int):
        self.prefix, self.threshold = prefix, threshold
        self.values: dict[str, object] = {}  # token -> the value, flat (a view of what ``f`` returned)
        self._tokens = count()

    @classmethod
    def from_greeting(cls, hello: dict) -> Holds | None:
        """What a relay of this host said in its greeting; None if it is malformed."""
        prefix, threshold = hello.get("prefix"), hello.get("threshold")
        if not shm.is_relay_prefix(prefix) or type(threshold) is not int or threshold <= 0:
            return None
        return cls(prefix, threshold)

    @property
    def holding(self) -> bool:
        return bool(self.values)

    def hold(self, arr) -> str | None:
        """Keep ``arr`` (C-contiguous) if it is big: its token; else None."""
        if arr.nbytes < self.threshold:
            return None
        token = str(next(self._tokens))
        self.values[token] = arr.reshape(-1)
        return token

    def release(self, tokens) -> None:
        for token in tokens if isinstance(tokens, list) else ():
            if isinstance(token, str):
                self.values.pop(token, None)

    def turn(self, content: dict) -> dict:
        """Combine bytes ``lo`` to ``hi`` (default: all) of the value
        ``content["token"]`` into the relay's segment (copy them, if
        ``first``): the answer for the relay, ``ok`` or ``error``."""
        token = content.get("token")
        answer = dict(req=content.get("req"), round=content.get("round"), token=token)
        if "lo" in content:  # a turn for a stripe: the answer says which
            answer["lo"] = content["lo"]
        value = self.values.get(token) if isinstance(token, str) else None
        try:
            if value is None:
                raise ValueError("it holds no such value (let go, or its relay changed)")
            op = content.get("op")
            if op not in OPS or content.get("dtype") != value.dtype.str:
                raise ValueError(f"a turn for op {op!r} and dtype {content.get('dtype')!r}")
            lo, hi = content.get("lo", 0), content.get("hi", value.nbytes)
            size = value.itemsize
            if not (
                type(lo) is int and type(hi) is int and 0 <= lo < hi <= value.nbytes and lo % size == hi % size == 0
            ):
                raise ValueError(f"a turn for bytes {lo!r} to {hi!r} of {value.nbytes}")
            part = value[lo // size : hi // size]
            if content.get("first") is True:
                shm.write_host_value(content.get("ref"), self.prefix, part.view("u1"), lo, value.nbytes)
            else:
                view = shm.map_host_value(content.get("ref"), self.prefix, value.nbytes, lo, hi)
                try:
                    self._combine(view, part, ufunc(op))
                finally:
                    view.release()
        except (ValueError, OSError) as e:
            return dict(answer, error=str(e))
        return dict(answer, ok=True)

    @staticmethod
    def _combine(view, value, u) -> None:
        import numpy as np

        acc = np.frombuffer(view, dtype=value.dtype)
        try:
            combine_into(u, acc, value)
        finally:
            del acc  # before the view is released


def answer_greeting(codec: P.Codec, msg, identity: str) -> tuple[list, list, dict | None]:
    """``(idents, frames, hello)`` of an engine's answer to a relay's greeting:
    its shared-memory identity; ``hello`` is the greeting's content if the
    relay is of this host (it says where big reduce values go: ``holds``).
    Raises ``ProtocolError``."""
    idents, body = P.split_idents(msg)
    codec.check_signature(body[:5])
    try:
        hello = codec.unpack_json(P.as_bytes(body[4]))
    except Exception:
        hello = None
    local = isinstance(hello, dict) and identity and hello.get("shm") == identity
    frames = codec.serialize(P.HELLO_REPLY, dict(shm=identity), P.as_bytes(body[1]))
    return idents, frames, hello if local else None


class HoldingKernel:
    """The kernel's part (``BroadcastKernel``): a relay's greeting answered,
    holds made from it, its turns answered at once, and requests held back
    while a value is kept (see ``holding`` and the kernel's ``_counted``)."""

    holds: Holds | None = None
    _released = None  # an asyncio.Event, set whenever no value is kept
    _shm_identity = None

    def _greeted(self, msg):
        if self._shm_identity is None:
            self._shm_identity = shm.identity()
        try:
            idents, frames, hello = answer_greeting(self.codec, msg, self._shm_identity)
        except P.ProtocolError as e:
            self.log.error("Invalid greeting: %s", e)
            return
        self.hold_for(hello)  # (a relay of another host: none)
        Direct(self.shell_stream).send_multipart(list(idents) + frames, copy=False)

    def _fold_message(self, msg):
        try:
            frames = self.on_fold_message(self.codec, msg)
        except (P.ProtocolError, ValueError) as e:
            self.log.error("Invalid host fold message: %s", e)
            return
        if frames is not None:
            Direct(self.shell_stream).send_multipart(frames, copy=False)

    def hold_for(self, hello: dict | None) -> None:
        """A relay greeted this engine: keep big values for it if it is of
        this host (``hello``: its greeting), and only on the lean path, where
        requests can be held back."""
        holds = Holds.from_greeting(hello) if hello is not None and self._context is not None else None
        if holds is not None and self.holds is not None and holds.prefix == self.holds.prefix:
            return  # the same relay again
        if self.holds is not None and self.holds.holding:
            log.warning("a new relay greeted this engine: %d reduce values it kept are let go", len(self.holds.values))
        self.holds = holds
        reduction.hold_values_with(holds.hold if holds is not None else None)
        self._let_go()

    @property
    def holding(self) -> bool:
        return self.holds is not None and self.holds.holding

    async def until_released(self) -> None:
        while self.holding:
            self._released.clear()
            await self._released.wait()

    def _let_go(self) -> None:
        if not self.holding and self._released is not None:
            self._released.set()

    def on_fold_message(self, codec: P.Codec, msg) -> list | None:
        """A relay's ``FOLD_TURN`` (the answer's frames) or ``FOLD_RELEASE`` (None)."""
        idents, body = P.split_idents(msg)
        parsed = codec.unpack(body)  # signed, and not a replay (a turn twice would add a value twice)
        kind, content = parsed["msg_type"], parsed["content"]
        if not isinstance(content, dict):
            raise P.ProtocolError("a host fold message without content")
        if kind == P.FOLD_RELEASE:
            if self.holds is not None:
                self.holds.release(content.get("tokens"))
            self._let_go()
            return None
        if kind != P.FOLD_TURN:
            raise P.ProtocolError(f"unknown host fold message {kind!r}")
        if self.holds is None:
            answer = dict(req=content.get("req"), round=content.get("round"), token=content.get("token"))
            answer["error"] = "it keeps no values"
        else:
            answer = self.holds.turn(content)
        return list(idents) + codec.serialize(P.FOLD_DONE, answer, parsed["raw_header"])
