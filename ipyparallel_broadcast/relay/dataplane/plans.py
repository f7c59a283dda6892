"""Where hosts sit in the data plane's ways, planned once for every transport.

The hosts of a request are put in one order, by the first engine id each
serves (``hosts_of``): the fixed order in which values combine. Each shape is
built on that order:

- ``heap``: a k-ary tree under the sender, breadth first (a push's; fanout 1
  is a chain);
- ``binary``: a binary tree under one root (a push's two trees: one over the
  order, one over its mirror);
- ``reduce_way``: one chain, or two mirrored binary trees (a reduce's): each
  host's link in each part, the hosts that feed it, and the part's head;
- ``ring``: the hosts round a ring (an allreduce's).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

CHAIN, TWO_TREES = "chain", "two trees"
MAX_FEEDS = 2  # hosts that send to one host: 1 in a chain, 2 in a binary tree
# chunks a host of two trees may send beyond what the host it feeds sent on: the
# fewest that keep the links busy (8 hosts at 200 Mbit/s, 16 MiB: 1 was 12 % slower
# than 2, and 4 was 11 % slower, its own half's chunks queued ahead of those it forwards)
WINDOW = 2


class ChunkHost(NamedTuple):
    ident: bytes  # the host relay's identity (a child of the leaf)
    url: str  # its chunk socket
    first: int  # the first engine id it serves


def hosts_of(groups: dict, links: dict) -> list[ChunkHost]:
    """The children in ``groups`` (child -> its targets) that have a chunk
    socket (``links``: child -> url), in the order of their first engine id."""
    return sorted((ChunkHost(c, links[c], min(sub)) for c, sub in groups.items() if c in links), key=lambda h: h.first)


def heap(hosts: Sequence, fanout: int) -> dict[object, list]:
    """A tree of ``hosts`` under the sender (key ``None``), breadth first:
    the sender feeds the first ``fanout``; host ``i`` feeds hosts
    ``fanout * (i + 1)`` to ``fanout * (i + 1) + fanout - 1``."""
    tree: dict[object, list] = {None: list(hosts[:fanout])}
    for i, host in enumerate(hosts):
        first = fanout * (i + 1)
        tree[host] = list(hosts[first : first + fanout])
    return tree


def binary(hosts: Sequence) -> dict[object, list]:
    """A binary tree of ``hosts`` in heap order under one root, which the
    sender (key ``None``) feeds: host ``i`` feeds hosts ``2i + 1`` and ``2i + 2``
    (a push's half of two trees; a reduce's runs the same way back)."""
    tree: dict[object, list] = {None: list(hosts[:1])}
    for i, host in enumerate(hosts):
        tree[host] = list(hosts[MAX_FEEDS * i + 1 : MAX_FEEDS * i + MAX_FEEDS + 1])
    return tree


def reduce_way(order: Sequence[ChunkHost], shape: str) -> tuple[list[bytes], list[bytes], dict[bytes, dict]]:
    """The way of the hosts (in ``order``) to the leaf, a chain or two trees:
    the hosts, the host that sends each part to the leaf, and each host's
    content (``parts``: its link in each part)."""
    orders, arity = ([list(order)], 1) if shape == CHAIN else ([list(order), list(order)[::-1]], MAX_FEEDS)
    contents: dict[bytes, dict] = {h[0]: dict(parts=[]) for h in order}
    for hosts in orders:
        for j, (ident, _url, _first) in enumerate(hosts):
            feeders = [h[1] for h in hosts[arity * j + 1 : arity * j + arity + 1]]
            to = hosts[(j - 1) // arity][1] if j else None
            part = dict(to=to, feeds=len(feeders), slot=(j - 1) % arity if j else 0)
            if shape == TWO_TREES:  # (two feeders share a link: each sends within a window, ``chains``)
                part.update(window=WINDOW, feeders=feeders)
            contents[ident]["parts"].append(part)
    return [h[0] for h in order], [hosts[0][0] for hosts in orders], contents


def ring(order: Sequence[ChunkHost]) -> tuple[list[bytes], dict[bytes, dict]]:
    """The ring of the hosts (in ``order``): their identities and each one's ring content."""
    urls = [h[1] for h in order]
    return [h[0] for h in order], {h[0]: dict(urls=urls, at=i) for i, h in enumerate(order)}
