"""Names the client, the hub's records and the engines share outside the
relay wire format: broadcast and per-engine ids, IOPub topics, the
connection-file key of the tree, and the dates in headers."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from .protocol import as_bytes

TREE_KEY = "broadcast_tree"  # in ipcontroller-client.json: the tree's shape


def parse_date(s):
    """ISO 8601 string to aware datetime, by the fast ``datetime.fromisoformat``
    when it can (``jupyter_client``'s ``dateutil`` parse otherwise, as ipyparallel's)."""
    try:
        dt = datetime.fromisoformat(s)
    except (TypeError, ValueError):
        from jupyter_client.jsonutil import parse_date as slow_parse

        return slow_parse(s)
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


IOPUB_HELLO_PREFIX = b"ipb-iopub-hello:"  # a client's IOPub subscription that asks for a hello
# a client's subscription to the hub's notifications that asks for the whole engine roster
ROSTER_HELLO_PREFIX = b"ipb-roster-hello:"
BROADCAST_ID_PREFIX = "ipb-"  # request msg_ids of broadcasts: the hub tells them apart


def is_broadcast_id(msg_id) -> bool:
    return isinstance(msg_id, str) and msg_id.startswith(BROADCAST_ID_PREFIX)


def engine_vid(msg_id: str, uuid: str) -> str:
    """The id of one engine's part of a broadcast: client and hub records agree."""
    return f"{msg_id}_{uuid}"


def engine_of_topic(topics: Sequence) -> int | None:
    """The engine id in an IOPub topic ``engine.<id>.<kind>`` (None if none)."""
    parts = as_bytes(topics[0]).split(b".") if topics else []
    if len(parts) >= 2 and parts[0] == b"engine" and parts[1].isdigit():
        return int(parts[1])
    return None
