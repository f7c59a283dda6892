"""The wire protocol between client, relay nodes and engines.

Frames, as ZeroMQ multipart messages (idents, then ``DELIM``, then a signed
Jupyter message whose buffers follow):

``ipb_request``  client -> root -> ... -> leaf
    content ``{msg_id, targets: [engine ids], reply: "coalesce"|"stream", req, compat,
    each, batch, reduce}``;
    buffers: the inner request ``[sig, header, parent, metadata, content, *bufs]``,
    serialized and signed once by the client and passed on untouched.
    Leaves send the same inner frames to every engine, idents ``[uuid, req]``.
    ``each`` (scatter, map): one count per target; the last ``sum(each)`` buffers
    are per-engine, in target order. A node forwards only its subtree's share;
    a leaf sends each engine the shared frames plus its own buffers. Buffers are
    not covered by the Jupyter signature, so nothing is re-signed.
    ``batch: [count, interval]`` (streaming only): a leaf merges up to ``count``
    replies, or what arrived within ``interval`` seconds, into one bundle.
    ``reduce: op`` (coalescing only): nodes combine results; see ``reduction``.
    ``allreduce: name`` (with ``reduce``, at the root): the combined value is
    not sent to the client; the root sends it down to the same engines, which
    bind it to ``name`` (``reduction.assign``), and the client gets how many did.
    ``quiet: true``: no copies of the replies to the hub's records (the root's
    own requests: an allreduce's second half).
    ``trace: true``: every node records when the request and the replies pass
    it (``ipb_stats`` fetches them); engines add ``ipb_received`` to replies.

``ipb_bundle``  leaf -> ... -> root -> client
    many engines' outcomes in one message: see ``bundles``.
    ``eids``: the engines whose outcome the bundle carries (streamed bundles only;
    a coalesced bundle carries the whole subtree).

``ipb_stats``  client -> root -> ... -> leaves, content ``{msg_id, trace}`` (``req`` below the root);
    ``trace``: a traced request's msg_id, whose events each node adds to its stats.
``ipb_stats_reply``  back up, content ``{msg_id, req, nodes: [{node, pending, ...}]}``:
    every node's own state (pending requests, drops, RSS), gathered up the tree.

``ipb_ping``  parent -> child, every ``ping_interval`` (stretched past 16 children), content
    ``{boot, pulse, every}`` (``every``: the interval, so the child knows when its parent is
    silent); ``ipb_pong``  child -> parent,
    in answer and once when the child starts, content ``{node, boot}``: ``boot`` is
    new each time the process starts, so a parent sees a restart at once. A child
    that cannot be reached, restarts, or stays silent for ``node_timeout`` is lost:
    requests waiting on it fail with an error naming it.
``ipb_host``  host relay -> its leaf, content ``{host, engines: {eid: uuid}, token}``: the
    engines behind the relay (all of them, each time). The leaf routes them to it
    and passes ``ipb_route {add, remove, to, host, token}`` up (``to``: the leaf's
    path); each node overrides its split for them (see ``relay.routes``).
    The root answers ``ipb_route_ack {to, host, token}``, sent down along ``to``
    to the relay. ``ipb_lost {uuid, why}``: leaf -> host relay, an engine the hub
    lost. ``ipb_join {eid, uuid}`` / ``ipb_joined {boot}``: an engine and the
    relay on its host (see ``relay.hostshell``).
``ipb_hello``  a leaf or host relay -> each engine it serves, idents ``[uuid, b"?hello"]``;
    our engines answer ``ipb_hello_reply {shm}`` with the same idents: their
    shared-memory identity. Engines whose identity is the relay's own get big
    buffers as a signed ``shm.Reference`` ident instead (see ``shm``, ``relay.sharing``).
``ipb_ping``  client -> root, content ``{ids}``: requests the client waits on;
    ``ipb_pong`` back, ``{node, boot, unknown}``: those the root does not hold
    (lost: see ``client.replies``).
"""

from __future__ import annotations

import hmac
import itertools
import os
from collections import deque
from collections.abc import Sequence
from datetime import UTC, datetime
from itertools import accumulate
from typing import Any

import zmq
from jupyter_client._version import protocol_version as JUPYTER_PROTOCOL
from jupyter_client.session import DELIM, Session

REQUEST = "ipb_request"
BUNDLE = "ipb_bundle"
STATS, STATS_REPLY = "ipb_stats", "ipb_stats_reply"  # survey of every node's state
PING, PONG = "ipb_ping", "ipb_pong"  # liveness of the links between nodes
HOST, LOST = "ipb_host", "ipb_lost"  # host relay <-> leaf: its engines; an engine lost
CHAIN_END = "ipb_chain_end"  # leaf -> host relay: reduce chains it gave up on, ``{keys}``
ROUTE, ROUTE_ACK = "ipb_route", "ipb_route_ack"  # routes announced up, acknowledged down
JOIN, JOINED = "ipb_join", "ipb_joined"  # an engine and the relay on its host
HELLO, HELLO_REPLY = "ipb_hello", "ipb_hello_reply"  # a relay greets an engine: shared memory?
HELLO_KEY = b"?hello"  # a greeting's request key (no request has it: keys are r<n>)
# a relay -> the engines of its host holding big reduce values (``relay.hostfold``, ``engine.holds``):
# combine yours into this segment now (the engine answers FOLD_DONE); let them go
FOLD_TURN, FOLD_DONE, FOLD_RELEASE = "ipb_gang_turn", "ipb_gang_done", "ipb_gang_release"  # (names on the wire kept)
FOLD_KEY = b"?gang"  # their request key
PROBE = b"ipb-probe"  # a host relay -> an engine, unsigned: is it connected? (engines drop it)
DROPPED = "ipb_dropped"  # a host relay -> an engine the hub dropped (signed): it exits
# the controller -> its clients, on their notices socket (``controller.notices``):
# a child process of the controller died (and was restarted, or given up on); I live
RESTARTED, BEAT = "ipb_restarted", "ipb_beat"
NOTICES_KEY = "ipb_notices"  # the client connection file: the port of the notices socket
# the hub -> one client, on its notification socket (``controller.roster``): every engine, and
# the number of the last notification; each notification's metadata numbers it (and the roster's epoch)
ROSTER, SEQ_KEY, EPOCH_KEY = "ipb_roster", "ipb_seq", "ipb_epoch"
REGISTERED, UNREGISTERED = "registration_notification", "unregistration_notification"  # the hub's own
# registration by host (``relay.registrar``, ``controller.hostreg``): a host relay -> the hub, its
# engines that ask to register and those gone; the hub's answer (the ids granted, in one message)
HOST_ENGINES, HOST_ENGINES_REPLY = "ipb_host_engines", "ipb_host_engines_reply"
# the hub -> clients and leaves: the engines one host registered, in one notification, on a
# topic of its own; ipyparallel's per-engine notifications go to stock subscribers alone
REGISTRATIONS = "ipb_registrations"
UNREGISTRATIONS = "ipb_unregistrations"  # a host's engines gone, one notification (``controller.roster``)
BATCH_NOTIFICATIONS = (REGISTRATIONS, UNREGISTRATIONS)
BATCH_TOPIC, STOCK_TOPIC = b"ipb-registrations", b"ipb-stock"
OURS_TOPIC = b"ipb-ours"  # a subscription that says: no stock copies here, batches instead
# in a connection request's content: the table only, no subscription follows (a leaf's lookup)
TABLE_ONLY = "ipb_table_only"
INBCAST, OUTBCAST = b"inbcast", b"outbcast"  # hub monitor topics: copies for task records
OUTBUNDLE = b"ipb_outbundle"  # a bundle the root sends up, for the records
COALESCE, STREAM = "coalesce", "stream"
REDUCE_OPS = ("sum", "prod", "min", "max")  # combined in the tree ("concat" is not: see view)
DIED, UNREACHABLE, UNKNOWN = "died", "unreachable", "unknown"  # failure codes
REPLY_MODES = (COALESCE, STREAM)
PROTOCOL_VERSION = 1
# request metadata {OUTPUTS_KEY: "reply"}: our engines answer with outputs in the
# reply's metadata under the same key, and publish no IOPub status (see kernel)
OUTPUTS_KEY = "ipb_outputs"
OUTPUTS_MARK = b'"' + OUTPUTS_KEY.encode() + b'"'  # in a request's raw metadata JSON
# request metadata of our client: the call's number, and the lowest one still owed (the
# engines let go of the replies they kept for calls below it: ``engine/kept.py``)
SEQ_KEY, OWED_KEY = "ipb_seq", "ipb_owed"
TRACE_KEY = "ipb_trace"  # request metadata: the engine stamps its reply ("ipb_received")
# request metadata {SHM_REPLY_KEY: [host, name prefix, threshold]}: an engine of the
# client's host puts its reply's big buffers in shared memory (``host.shm.share_reply``)
# and names the segment in its reply's metadata under SHM_KEY
SHM_REPLY_KEY = "ipb_shm_reply"
SHM_KEY = "ipb_shm"
_DELIM = DELIM if isinstance(DELIM, bytes) else DELIM.encode()
HUB_TOPIC = _DELIM  # the first frame, so the PUB topic, of a message sent without idents (the hub's notifications)
JSON_PACKERS = frozenset(
    ("json", "orjson")
)  # Session packers whose messages are JSON text (orjson: when installed, the default)

Frames = list[Any]  # bytes, memoryview or zmq.Frame


class ProtocolError(ValueError):
    """A message that does not follow this protocol (dropped and logged)."""


def as_bytes(frame) -> bytes:
    return frame.bytes if isinstance(frame, zmq.Frame) else bytes(frame)


def nbytes(frame) -> int:
    """A frame's size in bytes (a memoryview's ``len`` counts items)."""
    return frame.nbytes if isinstance(frame, memoryview) else len(frame)


# Frames of a message sent on (buffers): each costs a send and a receive at every hop, ~5 µs
# apiece on a loaded machine, where copying a small frame costs nanoseconds; so the small ones
# travel joined in one frame, and a big one (zero-copy) alone.
PACK_BELOW = 64 * 1024  # frames smaller than this are joined (pyzmq copies them on send anyway)
JOINED = "joined"  # a request's table of its joined frames (``join_small``), absent if not joined


def join_small(frames: Sequence) -> tuple[list | None, list]:
    """``(table, frames to send)``: the frames under ``PACK_BELOW`` bytes
    joined in one frame, first, and the others after it, alone; the table
    gives each frame's size, -1 for one sent alone (``split_joined``). No
    table if fewer than two frames are small: the frames go as they are."""
    sizes = [nbytes(f) for f in frames]
    if sum(1 for n in sizes if n < PACK_BELOW) < 2:
        return None, list(frames)
    joined = b"".join(f for f, n in zip(frames, sizes) if n < PACK_BELOW)
    return [n if n < PACK_BELOW else -1 for n in sizes], [joined] + [
        f for f, n in zip(frames, sizes) if n >= PACK_BELOW
    ]


def split_joined(table, frames) -> list:
    """The frames ``join_small`` joined, from its ``table``: slices of the
    joined frame (memoryviews: no copy), and the frames sent alone."""
    if not isinstance(table, list) or not frames or not set(map(type, table)) <= INTS:
        raise ProtocolError("invalid joined-frame table")
    joined, alone = memoryview(frames[0]), len(frames) - 1
    if table and min(table) >= 0:  # (the usual table: every frame small, a slice each)
        ends = list(accumulate(table))
        if alone or ends[-1] != joined.nbytes:
            raise ProtocolError("joined-frame table does not match the frames")
        return [joined[a:b] for a, b in zip([0, *ends], ends)]
    if sum(n for n in table if n >= 0) != joined.nbytes or sum(1 for n in table if n < 0) != alone:
        raise ProtocolError("joined-frame table does not match the frames")
    out, offset, rest = [], 0, iter(frames[1:])
    for n in table:
        if n >= 0:
            out.append(joined[offset : offset + n])
            offset += n
        else:
            out.append(next(rest))
    return out


def is_probe(frames) -> bool:
    """A host relay's probe? (Sizes first: a request's last frame may be megabytes.)"""
    return len(frames[-1]) == len(PROBE) and as_bytes(frames[-1]) == PROBE


def may_be_dropped(frames) -> bool:
    """Could this be a drop notice (``DROPPED`` in the header frame)? A cheap look."""
    return 3 < len(frames) and len(frames[3]) < 4096 and DROPPED.encode() in as_bytes(frames[3])


def split_idents(frames: Sequence) -> tuple[list, list]:
    """Split ``[*idents, DELIM, *body]`` without copying any large frame."""
    n = len(_DELIM)
    for i, frame in enumerate(frames):
        if len(frame) == n and as_bytes(frame) == _DELIM:
            return list(frames[:i]), list(frames[i + 1 :])
    raise ProtocolError("no <IDS|MSG> delimiter")


def _no_date_parsing():
    """Header dates stay strings: parsing them is wasted work (what
    ipyparallel's client does to its sessions, without importing
    ipyparallel into a relay process)."""
    from jupyter_client import session

    session.extract_dates = lambda obj: obj


def _keyed_hmac(key: bytes, digest_mod):
    """An HMAC keyed once, to ``copy()`` per message: OpenSSL's own object
    where there is one (its copy and update stay in C)."""
    try:
        import _hashlib

        return _hashlib.hmac_new(key, digestmod=digest_mod().name)
    except Exception:
        return hmac.new(key, digestmod=digest_mod)


class Codec:
    """Signed messages of a ``jupyter_client`` Session's wire format, packed and
    checked with the session's key, digest and packers read once (each Session
    attribute is a traitlet, and its ``msg``/``serialize``/``deserialize`` read
    dozens per message: most of a relay node's time per message)."""

    def __init__(self, session: Session):
        self.session = session
        self.history_size = session.digest_history_size  # signatures remembered against replays
        _no_date_parsing()
        self.key = session.key or b""
        self._auth = _keyed_hmac(self.key, session.digest_mod) if self.key else None
        self.pack_json, self.unpack_json = session.pack, session.unpack
        self._user, self._id = session.username, session.session
        self._metadata = dict(session.metadata)
        self._count = itertools.count()
        # the hashes of the signatures of unpacked messages (replays are refused): a 64-bit
        # int is 36 bytes, a hex signature 97 (4.7 MB per process when full, not 8.6)
        self._seen: set = set()
        self._seen_order: deque = deque()
        self.json = session.packer in JSON_PACKERS and session.unpacker in JSON_PACKERS  # see splices_json
        # an engine's reply metadata when it printed nothing holds this, packed as here
        self.no_outputs = self.pack_json({OUTPUTS_KEY: dict(stdout="", stderr="", outputs=[])})[1:-1]

    def sign(self, parts: Sequence[bytes]) -> bytes:
        """The HMAC of ``[header, parent, metadata, content]`` (b"" without a key)."""
        if self._auth is None:
            return b""
        h = self._auth.copy()  # keyed once: no key schedule per message
        h.update(b"".join(parts))
        return h.hexdigest().encode()

    def header(self, msg_type: str) -> dict:
        """A new message header, as ``Session.msg_header`` makes it."""
        return dict(
            msg_id=f"{self._id}_{os.getpid()}_{next(self._count)}",
            msg_type=msg_type,
            username=self._user,
            session=self._id,
            date=datetime.now(UTC).isoformat().replace("+00:00", "Z"),
            version=JUPYTER_PROTOCOL,
        )

    def serialize(self, msg_type: str, content, parent=None, metadata=None, header=None) -> Frames:
        """``[DELIM, sig, header, parent, metadata, content]``, as ``Session.serialize``
        of ``Session.msg`` gives; ``content`` and ``parent`` may be packed already
        (bytes: a request's own header frame, say)."""
        md = dict(self._metadata, **metadata) if metadata else self._metadata
        parts = [
            self.pack_json(header or self.header(msg_type)),
            parent if isinstance(parent, bytes) else self.pack_json(parent or {}),
            self.pack_json(md),
            content if isinstance(content, bytes) else self.pack_json(content),
        ]
        return [_DELIM, self.sign(parts)] + parts

    def pack(self, msg_type: str, content: dict, buffers: Sequence = (), parent=None) -> Frames:
        """``[DELIM, sig, header, parent, metadata, content, *buffers]``."""
        return self.serialize(msg_type, content, parent) + list(buffers)

    def unpack(self, body: Sequence, content: bool = True) -> dict:
        """Check the signature of ``[sig, header, parent, metadata, content, *buffers]``
        and parse it (the content stays bytes if ``content=False``); buffers stay
        the frames they came in as. A signature seen before is a replay, refused
        (as ``Session.deserialize`` does)."""
        if len(body) < 5:
            raise ProtocolError(f"message has {len(body)} frames, needs at least 5")
        parts = [as_bytes(f) for f in body[:5]]
        if self.key:
            signature = parts[0]
            if not signature:
                raise ProtocolError("unsigned message")
            if hash(signature) in self._seen:  # a bytes' hash is computed once, kept on it
                raise ProtocolError("duplicate signature (a replay)")
            if not hmac.compare_digest(signature, self.sign(parts[1:5])):
                raise ProtocolError("invalid signature")
            if content:
                self._remember(signature)
        load = self._load
        try:
            header = load(parts[1])
            msg = dict(
                header=header,
                msg_id=header["msg_id"],
                msg_type=header["msg_type"],
                parent_header=load(parts[2]),
                metadata=load(parts[3]),
                content=load(parts[4]) if content else parts[4],
            )
        except Exception as e:
            raise ProtocolError(f"bad message: {e}") from e
        if not (type(msg["parent_header"]) is dict and type(msg["metadata"]) is dict):
            raise ProtocolError("bad message: a parent header or metadata that is not a dict")
        msg["buffers"] = list(body[5:])
        msg["raw_header"] = parts[1]  # a reply's parent header, as it came
        return msg

    def _load(self, part: bytes):
        return {} if part == b"{}" else self.unpack_json(part)

    def seen(self, signature) -> bool:
        """Was a message with this signature unpacked here (a copy of it would be refused)?"""
        return bool(self.key) and hash(as_bytes(signature)) in self._seen

    @property
    def remembered(self) -> int:
        """Signatures held against replays (at most ``history_size``)."""
        return len(self._seen_order)

    def _remember(self, signature: bytes):
        key = hash(signature)  # SipHash, keyed per process: no sender can aim a collision
        self._seen.add(key)
        self._seen_order.append(key)
        if len(self._seen_order) > self.history_size:
            self._seen.discard(self._seen_order.popleft())

    def content(self, msg: dict) -> dict:
        """The content of a message unpacked with ``content=False``, parsed."""
        try:
            content = self.unpack_json(as_bytes(msg["content"]))
        except Exception as e:
            raise ProtocolError(f"unreadable content: {e}") from e
        if not isinstance(content, dict):
            raise ProtocolError("content is not a dict")
        return content

    def check_signature(self, body: Sequence) -> None:
        """Verify a raw message's HMAC without parsing it."""
        if len(body) < 5:
            raise ProtocolError(f"message has {len(body)} frames, needs at least 5")
        if not self.key:
            return
        if not hmac.compare_digest(as_bytes(body[0]), self.sign([as_bytes(f) for f in body[1:5]])):
            raise ProtocolError("invalid signature")


def to_engine(uuid: str, key: bytes, inner: Sequence) -> Frames:
    """A request as a leaf sends it to one engine: idents ``[uuid, key]``."""
    return [uuid.encode(), key, _DELIM] + list(inner)


def with_route(route: Sequence, body: Sequence) -> Frames:
    """``[*route, DELIM, *body]``: a message body sent back along ``route``."""
    return list(route) + [_DELIM] + list(body)


def record_copy(topic: bytes, ident, body: Sequence) -> Frames:
    """A copy for the hub's monitor (task records): ``[topic, ident, DELIM, *body]``."""
    return [topic, ident, _DELIM] + list(body)


RECORD_LIMIT = 1 << 20  # a request buffer this big is not copied to the hub's records
STRIPPED = b"ipb-stripped "  # its stand-in there: the mark, then its size in bytes


def strip_big(frames: Sequence, n_buffers: int, limit: int = RECORD_LIMIT) -> Frames:
    """``frames`` with each of its last ``n_buffers`` frames of ``limit`` bytes
    or more replaced by ``STRIPPED`` and its size. Buffers are not signed, so
    the copy stays valid; the hub keeps a request's metadata, not the user's data."""
    out, start = list(frames), len(frames) - n_buffers
    for i in range(max(start, 0), len(out)):
        size = nbytes(out[i])
        if size >= limit:
            out[i] = STRIPPED + str(size).encode()
    return out


def is_stripped(frame) -> bool:
    return len(frame) < 64 and as_bytes(frame).startswith(STRIPPED)


def request_content(msg_id: str, targets: Sequence[int], reply: str, **extra) -> dict:
    return dict(msg_id=msg_id, targets=list(targets), reply=reply, **extra)


INTS = frozenset((int,))  # ``set(map(type, xs)) <= INTS``: all plain ints (no bools), in one C-level pass


def validate_request(content: Any) -> dict:
    """Check the fields of an ``ipb_request`` that routing relies on."""
    if not isinstance(content, dict):
        raise ProtocolError("request content is not a dict")
    targets = content.get("targets")
    if not isinstance(targets, list) or (targets and (not set(map(type, targets)) <= INTS or min(targets) < 0)):
        raise ProtocolError(f"targets must be a list of engine ids, not {targets!r}")
    if len(set(targets)) != len(targets):
        raise ProtocolError("targets name an engine more than once")
    if content.get("reply") not in REPLY_MODES:
        raise ProtocolError(f"reply must be one of {REPLY_MODES}")
    if not isinstance(content.get("msg_id"), str):
        raise ProtocolError("msg_id must be a string")
    each = content.get("each")
    if each is not None and (
        not isinstance(each, list) or len(each) != len(targets) or not all(type(n) is int and n >= 0 for n in each)
    ):
        raise ProtocolError("each must give a buffer count per target")
    batch = content.get("batch")
    if batch is not None:
        if content["reply"] != STREAM or not isinstance(batch, list) or len(batch) != 2:
            raise ProtocolError("batch must be [count, interval] on a streaming request")
        count_, interval = batch
        if (
            type(count_) is not int
            or count_ < 1
            or not (interval is None or (isinstance(interval, (int, float)) and interval >= 0))
        ):
            raise ProtocolError(f"bad batch {batch!r}")
    op = content.get("reduce")
    if op is not None and (op not in REDUCE_OPS or content["reply"] != COALESCE):
        raise ProtocolError(f"reduce must be one of {REDUCE_OPS} on a coalescing request")
    spec = content.get("vshm")
    if spec is not None and not (
        op is not None
        and isinstance(spec, list)
        and len(spec) == 3
        and isinstance(spec[0], str)
        and isinstance(spec[1], str)
        and type(spec[2]) is int
    ):
        raise ProtocolError(f"vshm must be [host, prefix, threshold] on a reduce request, not {spec!r}")
    name = content.get("allreduce")
    if name is not None and (op is None or not isinstance(name, str) or not name.isidentifier()):
        raise ProtocolError(f"allreduce must name a variable of a reduce request, not {name!r}")
    return content


def split_each(inner: Sequence, targets: Sequence[int], each) -> tuple[list, dict]:
    """Shared frames, and each target's own buffers, of a request with ``each``."""
    n_own = sum(each or ())
    if len(inner) - n_own < 5:
        raise ProtocolError("each counts more buffers than the request has")
    shared, own, offset = list(inner[: len(inner) - n_own]), {}, len(inner) - n_own
    for eid, n in zip(targets, each or ()):
        own[eid] = list(inner[offset : offset + n])
        offset += n
    return shared, own
