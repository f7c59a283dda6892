"""Handlers on an I/O thread that never stop their stream.

pyzmq's ``ZMQStream`` re-raises an exception from its receive callback, and the
stream then reads no more: its edge-triggered read event is never re-armed, and
every later message on that socket waits forever. ``contained`` wraps a
handler so that an exception is logged with the message that caused it,
``on_error`` fails only what that message concerns, and the stream goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from jupyter_client.session import Session

from ..wire.protocol import as_bytes, split_idents

log = logging.getLogger(__name__)


def describe(session: Session, frames: Sequence) -> str:
    """A short, safe description of a raw message for a log line: its type,
    id and parent id, or its frame sizes if it cannot be read."""
    try:
        _, body = split_idents(frames)
        header, parent = session.unpack(as_bytes(body[1])), session.unpack(as_bytes(body[2]))
        return f"{header.get('msg_type')} {header.get('msg_id')} (parent {parent.get('msg_id') if parent else None})"
    except Exception:
        sizes = [len(as_bytes(f)) for f in frames[:8]]
        return f"unreadable message of {len(frames)} frame(s), sizes {sizes}"


def contained(handler: Callable, session: Session, what: str, on_error: Callable | None = None) -> Callable:
    """``handler(frames)``, logging any exception instead of raising it into
    the stream; then ``on_error(frames, exc)``, itself contained."""

    def run(frames):
        try:
            return handler(frames)
        except Exception as e:
            log.error("%s handler failed on %s; message dropped", what, describe(session, frames), exc_info=True)
            if on_error is not None:
                try:
                    on_error(frames, e)
                except Exception:
                    log.error("%s: failing what the message concerns failed too", what, exc_info=True)

    run.__wrapped__ = handler
    return run


def guarded_callback(callback: Callable, what: str) -> Callable:
    """A periodic or scheduled callback that logs, and does not raise."""

    def run(*args, **kwargs):
        try:
            return callback(*args, **kwargs)
        except Exception:
            log.error("%s failed", what, exc_info=True)

    return run
