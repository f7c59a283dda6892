"""Where engines and clients find a controller that listens on every interface.

A controller started with ``--ip='*'`` (as on a compute node, where it
cannot know which network its engines use) writes ``location`` into its
connection files, and they connect there (a controller on one address is
connected to at that address). IPython Parallel's default is the
hostname; on many nodes, and on the test bed, ``/etc/hosts`` maps it to a
loopback address, which every other host reads as itself. Then the address
this host's default route leaves by is the location.
"""

from __future__ import annotations

import ipaddress
import socket

NOWHERE = ("192.0.2.1", 9)  # TEST-NET-1: a UDP connect sends nothing, it only picks a route


def routed_address() -> str | None:
    """The source address of this host's default route, or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(NOWHERE)
        except OSError:
            return None
        addr = s.getsockname()[0]
    return None if ipaddress.ip_address(addr).is_loopback or addr == "0.0.0.0" else addr


def reachable_location(name: str | None = None) -> str:
    """``name`` (default: the hostname) unless it resolves to loopback only."""
    name = name or socket.gethostname()
    try:
        found = {info[4][0] for info in socket.getaddrinfo(name, None, socket.AF_INET)}
    except OSError:
        found = set()
    if found and not all(ipaddress.ip_address(a).is_loopback for a in found):
        return name
    return routed_address() or name


WILDCARDS = ("*", "0.0.0.0", "")


def located(app) -> str | None:
    """``IPController.location`` that other hosts can reach, when it matters:
    for a controller on every interface whose location nobody set (``app``
    is read: its config, ``engine_ip``, ``client_ip``); None keeps its own. On
    one address (127.0.0.1 by default) it stays IPython Parallel's hostname,
    which clients compare with their own."""
    names = {"IPController"} | {cls.__name__ for cls in type(app).__mro__}  # where config may set it
    given = any("location" in app.config.get(name, {}) for name in names)
    if not given and any(ip in WILDCARDS for ip in (app.engine_ip, app.client_ip)):
        return reachable_location()
    return None
