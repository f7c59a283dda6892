"""Ports the controller picks for itself, from below the OS's ephemeral range.

IPython Parallel picks each port it is not given by binding port 0 and closing
the socket at once (``util.select_random_ports``); the process that serves the
port binds it later. Meanwhile any outgoing TCP connection on the host may take
the same port as its local end (the kernel draws those from the same ephemeral
range), and the bind then fails: a heart monitor that cannot bind leaves every
engine without heartbeats, unregistered. Ports below that range are never given
to connections, so ours come from there (Linux: ``ip_local_port_range``).
"""

from __future__ import annotations

import random
import socket

LOWEST = 10_000  # never below: well-known and registered services crowd the low ports
_given: set[int] = set()


def ephemeral_range() -> tuple[int, int] | None:
    """The OS's ephemeral port range, or None where it cannot be read."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
    except (OSError, ValueError):
        return None
    return lo, hi


def quiet_port(tries: int = 200) -> int | None:
    """A port free now, below the ephemeral range and not given before in this
    process; None if there is no room there (the caller then picks as ipyparallel does)."""
    span = ephemeral_range()
    if span is None or span[0] - LOWEST < 1000:
        return None
    for _ in range(tries):
        port = random.randrange(LOWEST, span[0])
        if port in _given:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("", port))
            except OSError:
                continue
        _given.add(port)
        return port
    return None
