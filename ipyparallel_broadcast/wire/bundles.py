"""Bundles: many engines' outcomes in one ``ipb_bundle`` message up the tree.

metadata ``{req, msg_id, kind, eids}`` is all a relay node reads (it checks the
signature, never parses the content); content ``{parts, failed, ...}``; the
buffers are the parts back to back, ``parts`` giving each one's frame count.

``kind == "replies"``: a leaf's checked engine replies, as a table. The content
holds what the client reads for every engine: ``engines`` (uuids), ``odd``
(``[k, status]`` where it is not ``ok``) and ``iopub`` (engines whose outputs
come on IOPub). Each reply's ``[header, metadata, content]`` JSON travels as
text in the first frame (``texts`` gives each one's size), bound to the signed
content by its ``digest`` and parsed only when read (``ReplyTable``): the
center reads one short document per host, not one per engine. Buffers under
``protocol.PACK_BELOW`` bytes travel joined in one frame (``packed``); the parts are
each engine's buffers. ``shm`` (``[[k, reference], ...]``) names the engines
whose big buffers wait in shared memory for a client of their host (their
frames are empty; ``host.shm.share_reply``).
``kind == "engines"``: each part is a raw engine reply ``[sig, header, ...]``
(a stock client needs the replies as the engines signed them).
``kind == "bundles"``: each part is a child's bundle, nested as received.
``kind == "reduced"``: content ``reduce`` holds the combined value's header
(its frames are part 0 if it has any) and the engines it covers; the other
parts are raw replies of engines whose function raised.
``failed``: ``[[engine_id, uuid, message, code], ...]`` engines that cannot
answer; ``code`` is ``died``, ``unreachable`` or ``unknown``.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Iterator
from itertools import accumulate
from typing import Any

from .protocol import (
    BUNDLE,
    INTS,
    OUTPUTS_KEY,
    SHM_KEY,
    Codec,
    Frames,
    ProtocolError,
    as_bytes,
    join_small,
    split_joined,
)

log = logging.getLogger(__name__)


def bundle_metadata(req, msg_id, kind, eids=None) -> dict:
    metadata = dict(req=req, msg_id=msg_id, kind=kind)
    if eids is not None:
        metadata["eids"] = eids
    return metadata


def pack_bundle(codec: Codec, req, msg_id, kind, parts, failed, eids=None) -> Frames:
    """Frames ``[sig, header, ...]`` (no DELIM) of a bundle of ``parts``, their
    small frames joined in one (``packed``: a root's bundle of 16 hosts' went
    from 145 frames to 22)."""
    content = dict(parts=[len(p) for p in parts], failed=failed)
    packed, frames = join_small([frame for part in parts for frame in part])
    if packed is not None:
        content["packed"] = packed
    return codec.serialize(BUNDLE, content, metadata=bundle_metadata(req, msg_id, kind, eids))[1:] + frames


def pack_replies(codec: Codec, req, msg_id, bodies, failed, eids=None) -> Frames:
    """Frames (no DELIM) of a ``replies`` bundle of checked raw engine replies
    (see the module's docstring). A reply whose metadata or content is not
    readable is left out and logged: the client's root watch fails that engine."""
    engines, texts, odd, iopub, kept, shared = [], [], [], [], [], []
    for body in bodies:
        metadata, content = as_bytes(body[3]), as_bytes(body[4])
        try:
            md, status = codec.unpack_json(metadata), codec.unpack_json(content)["status"]
            uuid, outputs = md["engine"], md.get(OUTPUTS_KEY)
            streams = outputs is None or bool(outputs.get("iopub"))
            if not isinstance(uuid, str):
                raise TypeError("engine is not a uuid")
        except Exception as e:
            log.error("Left out an unreadable engine reply to %s: %r", msg_id, e)
            continue
        k = len(engines)
        if SHM_KEY in md:
            shared.append([k, md[SHM_KEY]])
        engines.append(uuid)
        if status != "ok":
            odd.append([k, status])
        if streams:
            iopub.append(k)
        texts.append(b"[%s,%s,%s]" % (as_bytes(body[1]), metadata, content))
        kept.append(body)
    text = b"".join(texts)
    head = dict(
        parts=[len(b) - 5 for b in kept],
        failed=failed,
        engines=engines,
        odd=odd,
        iopub=iopub,
        texts=[len(t) for t in texts],
    )
    if shared:
        head["shm"] = shared
    if codec.key:
        head["digest"] = hashlib.sha256(text).hexdigest()
    packed, frames = join_small([frame for b in kept for frame in b[5:]])
    if packed is not None:
        head["packed"] = packed
    metadata = bundle_metadata(req, msg_id, "replies", eids)
    return codec.serialize(BUNDLE, head, metadata=metadata)[1:] + [text] + frames


class SlicesEach:
    """Each engine's buffers when each has as many, all joined in one frame
    (the usual table: a result's pickle, and its small arrays or bytes), made
    as slices when read. A table of 1,024 replies then holds no object per
    engine (a list and a memoryview per buffer, each tracked by the garbage
    collector: at 1,024 engines four young collections per call)."""

    __slots__ = ("joined", "ends", "per", "n")

    def __init__(self, joined: memoryview, ends: list, per: int):
        self.joined, self.ends, self.per = joined, ends, per  # buffer i: joined[ends[i]:ends[i + 1]]
        self.n = (len(ends) - 1) // per

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, k: int) -> list:
        if not 0 <= k < self.n:
            raise IndexError("no such engine in the table")
        joined, ends, per = self.joined, self.ends, self.per
        if per == 1:
            return [joined[ends[k] : ends[k + 1]]]
        return [joined[ends[i] : ends[i + 1]] for i in range(k * per, (k + 1) * per)]


def _table_parts(content: dict, buffers: list, n: int):
    """A replies table's parts: each engine's list of buffers."""
    packed, counts = content.get("packed"), content.get("parts")
    per = counts[0] if isinstance(counts, list) and counts and type(counts[0]) is int else 0
    if (  # the usual table: as many small buffers each, read as slices when asked
        per > 0
        and isinstance(packed, list)
        and len(buffers) == 1
        and len(counts) == n
        and len(packed) == per * n
        and counts.count(per) == n
        and set(map(type, packed)) <= INTS
        and set(map(type, counts)) <= INTS
        and min(packed) >= 0
    ):
        ends = [0, *accumulate(packed)]
        joined = memoryview(buffers[0])
        if ends[-1] != joined.nbytes:
            raise ProtocolError("bundle buffer table does not match its frames")
        return SlicesEach(joined, ends, per)
    if packed is not None:
        buffers = split_joined(packed, buffers)
    return _parts(counts, buffers, n)


class ReplyTable:
    """A ``replies`` bundle, read: each engine's uuid, status, IOPub flag and
    buffers at once; its header, metadata and content when first asked."""

    __slots__ = ("codec", "engines", "parts", "odd", "iopub", "text", "offsets", "parsed", "shm", "lost")

    def __init__(self, codec: Codec, content: dict, buffers: list):
        engines, sizes, odd, iopub = (content.get(k) for k in ("engines", "texts", "odd", "iopub"))
        if not (
            isinstance(engines, list)
            and isinstance(sizes, list)
            and isinstance(odd, list)
            and isinstance(iopub, list)
            and len(sizes) == len(engines)
            and buffers
        ):
            raise ProtocolError("replies bundle has an invalid table")
        self.text = memoryview(buffers[0])
        try:
            self.offsets = [0, *accumulate(sizes)]  # reply k's text: [offsets[k], offsets[k + 1])
        except TypeError as e:
            raise ProtocolError(f"replies bundle has invalid text sizes: {e}") from e
        if self.offsets[-1] != self.text.nbytes or (sizes and min(sizes) < 0):
            raise ProtocolError("replies bundle texts do not match their sizes")
        if codec.key and not hmac.compare_digest(str(content.get("digest")), hashlib.sha256(self.text).hexdigest()):
            raise ProtocolError("replies bundle texts do not match their digest")
        self.parts = _table_parts(content, buffers[1:], len(engines))
        try:
            self.odd, self.iopub = dict(odd), frozenset(iopub)
        except (TypeError, ValueError) as e:
            raise ProtocolError(f"replies bundle has an invalid table: {e}") from e
        self.codec, self.engines, self.parsed = codec, engines, {}
        shm = content.get("shm") or []
        if not isinstance(shm, list) or not all(
            isinstance(s, list) and len(s) == 2 and type(s[0]) is int and 0 <= s[0] < len(engines) for s in shm
        ):
            raise ProtocolError("replies bundle has an invalid shared-memory table")
        if shm and isinstance(self.parts, SlicesEach):
            self.parts = list(self.parts)  # lists the client fills in place (``client.shared``)
        self.shm = shm  # [[k, reference content]]: filled in by the client (``client.shared``)
        self.lost: dict[int, str] = {}  # k -> why its shared buffers could not be read

    def status(self, k: int):
        return self.odd.get(k, "ok")

    def message(self, k: int) -> dict:
        """Reply ``k`` as ``{header, metadata, content, buffers}``, parsed once."""
        msg = self.parsed.get(k)
        if msg is None:
            try:
                header, metadata, content = self.codec.unpack_json(
                    bytes(self.text[self.offsets[k] : self.offsets[k + 1]])
                )
            except Exception as e:
                raise ProtocolError(f"unreadable reply in a bundle: {e}") from e
            msg = self.parsed[k] = dict(header=header, metadata=metadata, content=content, buffers=self.parts[k])
        return msg


class Entry:
    """Engine reply ``k`` of a ``ReplyTable``; reads like its parsed message."""

    __slots__ = ("table", "k")

    def __init__(self, table: ReplyTable, k: int):
        self.table, self.k = table, k

    @property
    def status(self):
        return self.table.odd.get(self.k, "ok")

    @property
    def buffers(self) -> list:
        return self.table.parts[self.k]

    def __getitem__(self, key):
        return self.table.message(self.k)[key]

    def __setitem__(self, key, value):
        self.table.message(self.k)[key] = value

    def get(self, key, default=None):
        return self.table.message(self.k).get(key, default)


def _parts(counts, buffers, n=None) -> list:
    if not isinstance(counts, list) or (n is not None and len(counts) != n):
        raise ProtocolError("bundle part counts do not match its frames")
    if len(counts) == len(buffers) and counts.count(1) == len(counts) and set(map(type, counts)) <= INTS:
        return [[b] for b in buffers]  # (the usual: a buffer each)
    if not all(type(c) is int and c >= 0 for c in counts) or sum(counts) != len(buffers):
        raise ProtocolError("bundle part counts do not match its frames")
    parts, offset = [], 0
    for c in counts:
        parts.append(buffers[offset : offset + c])
        offset += c
    return parts


def pack_reduced(codec: Codec, req, msg_id, state, value_frames, raised, failed) -> Frames:
    """Frames (no DELIM) of a ``reduced`` bundle: a node's combined value and the
    raw replies of engines whose function raised."""
    parts = ([value_frames] if state.get("value") is not None else []) + list(raised)
    content = dict(parts=[len(p) for p in parts], failed=failed, reduce=state)
    return codec.serialize(BUNDLE, content, metadata=bundle_metadata(req, msg_id, "reduced"))[1:] + [
        frame for part in parts for frame in part
    ]


def reduced_parts(msg: dict) -> tuple[dict, list, list, list]:
    """``(state, value frames, raised replies, failed)`` of an unpacked ``reduced``
    bundle whose content was parsed."""
    content = msg["content"]
    state = content.get("reduce") if isinstance(content, dict) else None
    if not isinstance(state, dict):
        raise ProtocolError("reduced bundle does not match its frames")
    parts = _parts(content.get("parts"), msg["buffers"])
    value = parts.pop(0) if state.get("value") is not None and parts else []
    return state, value, parts, content.get("failed", [])


def splices_json(codec: Codec) -> bool:
    """Whether engine replies can travel as JSON text in a table (the default packer)."""
    return codec.json


def iter_bundle(codec: Codec, msg: dict, tables: bool = False) -> Iterator[tuple[str, Any]]:
    """Flatten an unpacked bundle into engine outcomes; see ``flatten``. A
    ``replies`` table gives ``("parsed", message)`` per engine, or, with
    ``tables``, one ``("table", ReplyTable)``."""
    content, buffers, kind = msg["content"], msg["buffers"], msg["metadata"].get("kind")
    if isinstance(content, bytes):  # checked by a relay node, parsed only here
        try:
            content = codec.unpack_json(content)
        except Exception as e:
            raise ProtocolError(f"bundle content is not valid: {e}") from e
    if not isinstance(content, dict):
        raise ProtocolError("bundle content is not a dict")
    if kind == "replies":
        return _replies(ReplyTable(codec, content, buffers), content.get("failed", []), tables)
    if "packed" in content:
        buffers = split_joined(content["packed"], buffers)
    return flatten(codec, kind, _parts(content.get("parts"), buffers), content.get("failed", []), tables)


def _replies(table: ReplyTable, failed, tables: bool) -> Iterator[tuple[str, Any]]:
    if tables:
        yield "table", table
    else:
        for k in range(len(table.engines)):
            yield "parsed", table.message(k)
    for failure in failed:
        yield "failed", failure


def flatten(codec: Codec, kind, parts, failed, tables: bool = False) -> Iterator[tuple[str, Any]]:
    """``("reply", frames)`` for each engine reply and ``("failed", [eid, uuid,
    message])`` for each engine that could not answer. Nested bundles
    (``kind == "bundles"``) are checked and unpacked on the way, unless
    already unpacked (a dict)."""
    for part in parts:
        if kind == "engines":
            yield "reply", part
        elif kind == "bundles":
            yield from iter_bundle(codec, part if isinstance(part, dict) else codec.unpack(part), tables)
        else:
            raise ProtocolError(f"unknown bundle kind {kind!r}")
    for failure in failed:
        yield "failed", failure
