"""Fuzz targets: every boundary where bytes from another process are read.

Each target takes one input (bytes), makes frames of it, feeds them to the
parser or node as a socket would, and raises ``Finding`` (or lets escape
whatever was not expected) if the code under test does anything but accept
or refuse cleanly. Signed surfaces are fuzzed past their signature: a
target signs what it made with the cluster's key, so the fuzzer reaches the
JSON and the checks behind the HMAC, as a holder of the key (a buggy engine)
would. The suite runs each on a fixed number of inputs and its corpus
(``tests/test_fuzz_targets.py``); ``benchmarks/scripts/fuzz.py`` runs them
coverage-guided (atheris) for longer.

- ``frames``: the parsers of what a node reads (``relay.events``).
- ``bundle``: a client reading a bundle (``wire.bundles.iter_bundle``).
- ``chunk``: a push's chunk headers at a host relay (``relay.dataplane.push_in``).
- ``shm_reference``: an engine mapping a request's shared-memory reference.
- ``reduce_value``: the reduce unpickler (``wire.unpickle``): nothing but
  ``CannedArray`` is loaded, none of its code runs, no memory is asked for
  beyond what the input holds.
- ``roster``: the hub's notifier answering subscriptions (``controller.roster``),
  and a client reading its notifications and rosters (``client.roster``).
- ``relay_events``: a relay node (root, interior, leaf or host relay) fed a
  sequence of arbitrary messages on each of its entry points.
"""

from __future__ import annotations

import pickle

from jupyter_client.session import Session

from ...client.roster import RosterSync
from ...controller.roster import Roster
from ...host import shm
from ...relay import events as E
from ...relay.dataplane.push_in import PushIn
from ...relay.node import RelayNode
from ...wire import bundles as B
from ...wire import protocol as P
from ...wire import reduction, unpickle
from ...wire.topology import HOST_PREFIX, TreeShape, node_identity

SEP = b"\xfe\xff"  # between frames in an input
KEY = b"fuzz-key"


class Finding(AssertionError):
    """The code under test did what it must not (beyond raising)."""


def frames_of(data: bytes, limit: int = 24) -> list[bytes]:
    return data.split(SEP, limit)[:limit]


class Signer:
    """Frames made valid as far as their signature goes."""

    def __init__(self):
        self.session = Session(key=KEY)
        self.codec = P.Codec(self.session)

    def signed(self, parts: list[bytes]) -> list[bytes]:
        """``[DELIM, signature, *four JSON parts, *buffers]`` over fuzzed parts
        (fewer than four: padded with ``{}``)."""
        head = (parts[:4] + [b"{}"] * 4)[:4]
        return [P._DELIM, self.codec.sign(head), *head, *parts[4:]]


_signer = Signer()


def _mixed(data: bytes) -> list[bytes]:
    """Raw frames, or (first byte odd) idents then a signed message."""
    frames = frames_of(data[1:])
    if not data or not data[0] & 1:
        return frames
    idents = frames[: data[0] >> 5]
    return idents + _signer.signed(frames[len(idents) :])


# --------------------------------------------------------------- targets
def frames(data: bytes) -> None:
    codec = Signer().codec  # a fresh one: no signature is "seen" from an earlier input
    msg = _mixed(data)
    for parse in (
        lambda: E.from_above(codec, msg, True, False),
        lambda: E.from_above(codec, msg, False, False),
        lambda: E.from_above(codec, msg, False, True),
        lambda: E.from_below(codec, msg, True),
        lambda: E.from_below(codec, msg, False),
        lambda: E.from_hub(codec, msg),
    ):
        try:
            parse()
        except P.ProtocolError:
            pass


def bundle(data: bytes) -> None:
    codec = Signer().codec
    msg = _signer.signed(frames_of(data))[1:]
    try:
        unpacked = codec.unpack(msg, content=False)
        for _ in B.iter_bundle(codec, unpacked, tables=bool(data[:1] and data[0] & 1)):
            pass
    except P.ProtocolError:
        pass


def chunk(data: bytes) -> None:
    bulk = PushIn(Signer().codec, lambda: 0.0, 10.0)
    try:
        bulk.on_chunk([HOST_PREFIX + b"feeder"] + _mixed(data))
    except P.ProtocolError:
        pass


def shm_reference(data: bytes) -> None:
    """An engine's view: a request whose idents hold a reference (signed or
    not) naming segments that are not there (or are: then mapped)."""
    parts = frames_of(data[1:])
    payload = parts[0] if parts else b""
    sign = _signer.codec.sign
    ref = shm.MARK + (sign([payload]) if data[:1] and data[0] & 1 else b"x" * 64) + b" " + payload
    body = _signer.signed(parts[1:]) if not data[:1] or not data[0] & 2 else parts[1:]
    msg = [b"route", ref] + body
    at = shm.reference_in(msg)
    if at is None:
        raise Finding("the reference was not found among the idents")
    try:
        shm.expand(msg, at, sign)
    except shm.ShmError:
        pass


class _Watched(unpickle.ValueUnpickler):
    """The reduce unpickler, with every class it hands out recorded."""

    loaded: list = []

    def find_class(self, module, name):
        cls = super().find_class(module, name)
        self.loaded.append(cls)
        return cls


def reduce_value(data: bytes) -> None:
    parts = frames_of(data)
    if data[:1] == b"\x80":  # a pickle opcode stream: the unpickler's own surface
        parts = [data] + parts[1:]
    _Watched.loaded = []
    canned = unpickle.canned_array_class()
    init, inits = canned.__init__, []
    canned.__init__ = lambda self, *a, **k: inits.append(a)
    unpickler, unpickle.ValueUnpickler = unpickle.ValueUnpickler, _Watched
    try:
        reduction.decode_engine(parts)
    except ValueError:
        pass
    finally:
        unpickle.ValueUnpickler = unpickler
        canned.__init__ = init
    if any(cls is not unpickle.inert_canned_array() for cls in _Watched.loaded):
        raise Finding(f"the reduce unpickler loaded {_Watched.loaded}")
    if inits:
        raise Finding(f"CannedArray code ran on {inits!r}")


def roster(data: bytes) -> None:
    """Subscription frames in to the hub's roster, then a signed message (of
    fuzzed parts) to a client's: each accepted, or refused cleanly."""
    parts = frames_of(data)
    hub = Roster(_signer.session, engines=lambda: {0: "uuid-0", 3: "uuid-3"})
    hub.replied()
    for frame in parts[:4]:
        for action in hub.subscription(frame):
            if action[0] not in ("subscribe", "unsubscribe", "send") or len(action) != 2:
                raise Finding(f"the roster answered {action!r}")
    sync = RosterSync({0: "uuid-0"})
    try:
        msg = Session(key=KEY).deserialize(_signer.signed(parts[4:] or parts)[1:])
    except (ValueError, TypeError, KeyError):
        return  # refused by the session: not JSON, not a message
    try:
        sync.read(msg)
    except P.ProtocolError:
        pass
    if not all(isinstance(k, int) and isinstance(v, str) for k, v in sync.engines.items()):
        raise Finding(f"the client's table took {sync.engines!r}")


def _node(kind: int) -> RelayNode:
    codec = Signer().codec
    shape = TreeShape(2, 2)
    path, host = [((), None), ((0,), None), ((0, 1), None), ((0, 1), "fuzzhost")][kind % 4]
    node = RelayNode(codec, shape, path, clock=lambda: 0.0, host=host)
    if node.is_leaf and not host:
        node.on_registry({1: "uuid-1", 5: "uuid-5"})
    return node


ENTRY = ("on_up", "on_down", "on_hub", "on_chunk", "on_pulse", "on_parent_pulse")


def relay_events(data: bytes) -> None:
    """Events on one node: each part of the input (split at ``SEP * 2``) is
    one message, its first byte picking the entry point; ticks between."""
    if not data:
        return
    node = _node(data[0])
    child = node_identity(node.path + (0,)) if not node.is_leaf else b"uuid-1"
    for event in data[1:].split(SEP * 2)[:16]:
        if not event:
            continue
        entry = getattr(node, ENTRY[event[0] % len(ENTRY)])
        msg = _mixed(event[1:])
        if event[0] & 0x40:
            msg = [child] + msg
        sends = entry(msg)
        if not isinstance(sends, list):
            raise Finding(f"{entry.__name__} gave {sends!r}")
        if not isinstance(node.on_tick(), list):
            raise Finding("on_tick gave no list")


TARGETS = dict(
    frames=frames,
    bundle=bundle,
    chunk=chunk,
    shm_reference=shm_reference,
    reduce_value=reduce_value,
    roster=roster,
    relay_events=relay_events,
)


def seeds() -> dict[str, list[bytes]]:
    """A few valid inputs per target, for the fuzzer to start from."""
    codec = _signer.codec
    request = [b"client"] + codec.pack(P.REQUEST, P.request_content("m1", [1, 5], P.COALESCE), [b"payload"])
    value = pickle.dumps(("py", 1))
    return dict(
        frames=[b"\x01" + SEP.join(request)],
        bundle=[SEP.join(B.pack_bundle(codec, "r1", "m1", "engines", [], [[1, "u", "gone", "died"]])[1:5])],
        chunk=[b"\x01" + SEP.join([b"{}", b"{}", b"{}", b'{"id": "b1", "i": 0, "d": ""}', b"data"])],
        shm_reference=[b"\x01" + b'{"name": "ipb-shm-x", "bufs": [[0, 0, 4]]}' + SEP + b"{}"],
        reduce_value=[value],
        relay_events=[b"\x00" + b"\x00" + b"\x01" + SEP.join(request[1:]), _ring_seed(codec), _trees_seed(codec)],
        roster=_roster_seeds(),
    )


def _roster_seeds() -> list[bytes]:
    """Subscriptions (everything, a hello, an unsubscription, a topic), then a
    roster, and a numbered registration, as the hub sends them."""
    from ...wire.naming import ROSTER_HELLO_PREFIX

    subscriptions = [b"\x01", b"\x01" + ROSTER_HELLO_PREFIX + b"s:1", b"\x00", b"\x01topic"]
    table = b'{"engines": {"0": "uuid-0", "2": "b"}, "seq": 4, "epoch": "e"}'
    roster = [b'{"msg_id": "1", "msg_type": "ipb_roster"}', b"{}", b"{}", table]
    notice = [b'{"msg_id": "2", "msg_type": "registration_notification"}', b"{}"]
    notice.append(b'{"ipb_seq": 5, "ipb_epoch": "e"}')
    notice.append(b'{"id": 7, "uuid": "u7"}')
    return [SEP.join(subscriptions + message) for message in (roster, notice)]


def _ring_seed(codec) -> bytes:
    """A host relay given its place in an allreduce's ring, then a ring chunk."""
    from ...relay.dataplane import ring
    from ...relay.dataplane.chunks import digest

    content = dict(P.request_content("m2", [1], P.COALESCE, req="r9", reduce="sum"), ring=dict(urls=["a", "b"], at=0))
    inner = codec.session.serialize(codec.session.msg("apply_request", content={}))[1:] + [b"payload"]
    place = codec.pack(P.REQUEST, content, inner)[2:]  # (the parts ``Signer`` signs)
    gather = codec.pack(ring.RGATHER, dict(key="r9", k=1, i=0, n=1, d=digest(b"data")), [b"data"])[2:]
    events = [b"\x00\x01" + SEP.join(place), b"\x03\x21" + SEP.join([b"feeder", *gather])]
    return b"\x03" + (SEP * 2).join(events)


def _trees_seed(codec) -> bytes:
    """A host relay given its place in a reduce's two trees, then a feeder's
    chunk of the first half and a credit from the host it feeds."""
    from ...relay.dataplane import chains as upchain
    from ...relay.dataplane.chunks import digest

    part = dict(to="a", feeds=1, slot=0, window=2, feeders=["b"])
    chain = dict(parts=[part, dict(part, to=None, feeds=0, feeders=[])])
    content = dict(P.request_content("m3", [1], P.COALESCE, req="r8", reduce="sum"), chain=chain)
    inner = codec.session.serialize(codec.session.msg("apply_request", content={}))[1:] + [b"payload"]
    place = codec.pack(P.REQUEST, content, inner)[2:]  # (the parts ``Signer`` signs)
    v = dict(dtype="float64", shape=[1], nbytes=8, chunk=8, at=0, whole=16)
    chunk = codec.pack(upchain.RCHUNK, dict(key="r8#0", i=0, n=1, v=v, s=0, d=digest(b"8 bytes.")), [b"8 bytes."])[2:]
    credit = codec.pack(upchain.RCREDIT, dict(key="r8#0", upto=4), [])[2:]
    events = [b"\x00\x01" + SEP.join(place), b"\x03\x21" + SEP.join([b"feeder", *chunk])]
    events.append(b"\x03\x21" + SEP.join([b"host", *credit]))
    return b"\x03" + (SEP * 2).join(events)
