"""What a relay node takes in and gives out, parsed once (as h11's events).

``from_above``, ``from_below`` and ``from_hub`` turn one message's frames into
one typed event: signature checked, shape checked. A ``ProtocolError`` means
the message is dropped. ``Send`` is what a node asks its shell to send.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..wire import protocol as P
from ..wire.topology import HOST_PREFIX
from .stock import CompatRequest

UP, DOWN, HUB = "up", "down", "hub"  # HUB: ask the hub for the engine table
MON = "mon"  # a copy for the hub's task records (see ``records``)
JOINED = "joined"  # host relay: engines (frames: who joined) now reachable through the tree
PULSE = "pulse"  # pings and pongs between a node and its host relays, on a link of their own


@dataclass
class Send:
    socket: str  # UP, DOWN, HUB, MON, JOINED or PULSE
    frames: list


# ------------------------------------------------------------------ from above
@dataclass
class Request:
    route: list  # idents replies go up with (at the root: the client's)
    content: dict  # checked by ``protocol.validate_request``
    inner: list  # the request frames for the engines, and any per-engine buffers
    frames: list  # as received (the root copies them to the hub's records)


@dataclass
class StockRequest:  # ipyparallel's own BroadcastView (root only)
    route: list
    compat: CompatRequest


@dataclass
class StatsRequest:
    route: list
    content: dict


@dataclass
class Ping:  # from a client (root) or the parent
    route: list
    content: dict


@dataclass
class RouteAck:
    content: dict


@dataclass
class ChainEnd:  # to a host relay: reduce chains (or allreduce rings) its leaf gave up on
    keys: list
    why: str


@dataclass
class Lost:  # to a host relay: an engine of its host the hub lost
    uuid: str
    why: str


@dataclass
class HostLost:  # to a host relay: a host relay it may pass calls to is lost (``forwarding``)
    ident: bytes
    boot: str | None  # that relay's life
    why: str


def from_above(codec: P.Codec, frames, is_root: bool, is_host: bool):
    route, body = P.split_idents(frames)
    msg = codec.unpack(body)
    kind, content = msg["header"].get("msg_type"), msg["content"]
    if kind == P.REQUEST:
        content = P.validate_request(content)
        table = content.pop(P.JOINED, None)  # (the node's own children get a table of their own)
        inner = msg["buffers"] if table is None else P.split_joined(table, msg["buffers"])
        return Request(route, content, inner, frames)
    if kind in (P.STATS, P.PING, P.ROUTE_ACK, P.LOST, P.CHAIN_END) and not isinstance(content, dict):
        raise P.ProtocolError(f"{kind} content is not a dict")
    if kind == P.STATS:
        return StatsRequest(route, content)
    if kind == P.PING:
        return Ping(route, content)
    if kind == P.ROUTE_ACK and not is_root:
        return RouteAck(content)
    if kind == P.LOST and is_host and isinstance(content.get("host"), str):
        boot = content.get("boot") if isinstance(content.get("boot"), str) else None
        return HostLost(HOST_PREFIX + content["host"].encode(), boot, str(content.get("why") or "is lost"))
    if kind == P.LOST and is_host:
        if not isinstance(content.get("uuid"), str):
            raise P.ProtocolError("engine-lost notice without a uuid")
        return Lost(content["uuid"], content.get("why") or P.DIED)
    if kind == P.CHAIN_END and is_host:
        keys = content.get("keys")
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise P.ProtocolError("chain-end notice without a list of keys")
        return ChainEnd(keys, str(content.get("why") or ""))
    if is_root and kind in CompatRequest.msg_types:
        return StockRequest(route, CompatRequest.parse(msg, body))
    raise P.ProtocolError(f"unexpected {kind!r} from above")


# ------------------------------------------------------------------ from below
@dataclass
class EngineReply:
    ident: object  # the engine's identity frame, as received
    uuid: str
    key: str  # the request's key at this node
    body: list  # [sig, header, parent, metadata, content, *buffers], signature checked


@dataclass
class ChildMessage:
    """From a child relay node or a host relay: a bundle, pong, survey reply,
    host engine list or route. The content stays unparsed (``content()``)."""

    ident: bytes
    kind: str
    msg: dict
    body: list

    def content(self, codec: P.Codec) -> dict:
        return codec.content(self.msg)


def from_below(codec: P.Codec, frames, is_leaf: bool) -> EngineReply | ChildMessage:
    if is_leaf and not P.as_bytes(frames[0]).startswith(HOST_PREFIX):
        idents, body = P.split_idents(frames)
        if len(idents) != 2:
            raise P.ProtocolError(f"engine reply with {len(idents)} idents")
        codec.check_signature(body)  # (over the body: the idents are the sockets' word)
        try:
            uuid, key = P.as_bytes(idents[0]).decode(), P.as_bytes(idents[1]).decode()
        except UnicodeDecodeError as e:
            raise P.ProtocolError(f"engine reply with idents that are not text: {e}") from e
        return EngineReply(idents[0], uuid, key, body)
    idents, body = P.split_idents(frames)
    if len(idents) != 1:
        raise P.ProtocolError(f"message from below with {len(idents)} idents")
    msg = codec.unpack(body, content=False)  # results stay unparsed
    return ChildMessage(P.as_bytes(idents[0]), msg["header"].get("msg_type"), msg, body)


# ------------------------------------------------------------- from the hub
@dataclass
class EngineRegistered:
    eid: int
    uuid: str


@dataclass
class EnginesRegistered:  # one host's, in one notification
    engines: dict[int, str]


@dataclass
class EnginesUnregistered:  # one engine, or a lost host's, in one notification
    uuids: list[str]


@dataclass
class HubEngineTable:  # the hub's whole engine table, asked for
    engines: dict[int, str]


def from_hub(codec: P.Codec, frames) -> object | None:
    """A hub notification or registry reply; ``None`` for what a node ignores."""
    msg = codec.unpack(P.split_idents(frames)[1])
    kind, content = msg["header"].get("msg_type"), msg["content"]
    try:
        if kind == P.REGISTERED:
            return EngineRegistered(int(content["id"]), str(content["uuid"]))
        if kind == P.REGISTRATIONS:
            return EnginesRegistered({int(k): str(v) for k, v in content["engines"].items()})
        if kind == P.UNREGISTERED:
            return EnginesUnregistered([str(content["uuid"])])
        if kind == P.UNREGISTRATIONS:
            return EnginesUnregistered([str(u) for u in content["engines"].values()])
        if isinstance(content, dict) and "engines" in content:
            if content.get("status") != "ok":
                return None
            return HubEngineTable({int(k): str(v) for k, v in content["engines"].items()})
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise P.ProtocolError(f"bad hub message {kind!r}: {e}") from e
    return None
