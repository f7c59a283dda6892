"""Logging that costs nothing when nothing is written."""

from __future__ import annotations

import logging


def drop_unwritten_levels(log: logging.Logger) -> None:
    """Raise ``log``'s level to its most verbose handler's.

    ipyparallel's apps keep their logger at DEBUG and filter in the handlers,
    so every ``log.debug`` on the hot path (the hub logs each monitored
    message) builds a LogRecord that no handler writes. What is written is
    unchanged.
    """
    if not log.handlers or (log.propagate and logging.getLogger().handlers):
        return  # records may go on to handlers we do not see
    lowest = min(h.level for h in log.handlers)
    if lowest > log.level:
        log.setLevel(lowest)
