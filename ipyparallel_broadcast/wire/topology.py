"""Shape of the relay tree and the routing rule, as pure functions.

A tree of ``depth`` levels below the root has ``fanout ** depth`` leaves.
Engine ``e`` connects to leaf ``e % n_leaves`` (ipyparallel's engines pick
``broadcast[id % len(broadcast)]``), so a node routes an engine id by the
base-``fanout`` digits of its leaf index, most significant first.
A node is named by its path of child digits from the root: ``()`` is the root.

Leaf balance: an engine stays on its leaf for life, so balance is kept where
engines arrive. The controller numbers each new engine with ``balanced_id``:
the next id that lands on a least-loaded leaf (ids are never reused; an id an
engine asks for, such as an MPI rank, is kept as is).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

Path = tuple[int, ...]


@dataclass(frozen=True)
class TreeShape:
    depth: int = 1
    fanout: int = 2

    def __post_init__(self):
        if self.depth < 0:
            raise ValueError(f"depth must be >= 0, not {self.depth}")
        if self.fanout < 2:
            raise ValueError(f"fanout must be >= 2, not {self.fanout}")

    @property
    def n_leaves(self) -> int:
        return self.fanout**self.depth

    @property
    def n_nodes(self) -> int:
        return sum(self.fanout**k for k in range(self.depth + 1))

    def nodes(self) -> Iterator[Path]:
        """All node paths, breadth first (root first)."""
        level: list[Path] = [()]
        for _ in range(self.depth + 1):
            yield from level
            level = [p + (d,) for p in level for d in range(self.fanout)]

    def is_leaf(self, path: Path) -> bool:
        return len(path) == self.depth

    def leaf_index(self, path: Path) -> int:
        """Index of a leaf (its path read as a base-fanout number)."""
        index = 0
        for digit in path:
            index = index * self.fanout + digit
        return index

    def leaf_path(self, index: int) -> Path:
        digits = []
        for _ in range(self.depth):
            index, digit = divmod(index, self.fanout)
            digits.append(digit)
        return tuple(reversed(digits))

    def leaf_of(self, engine_id: int) -> int:
        return engine_id % self.n_leaves

    def serves(self, path: Path, engine_id: int) -> bool:
        """Whether engine_id lives in the subtree under ``path``: its leaf's
        index falls in the subtree's range of leaves."""
        width = self.fanout ** (self.depth - len(path))
        first = self.leaf_index(path) * width
        return first <= engine_id % self.n_leaves < first + width

    def child_digit(self, path: Path, engine_id: int) -> int:
        """Which child of node ``path`` the engine's leaf lies under."""
        below = self.depth - len(path) - 1
        return (self.leaf_of(engine_id) // self.fanout**below) % self.fanout

    def split(self, path: Path, engine_ids: Iterable[int], overrides: dict | None = None) -> dict[int, list[int]]:
        """Split engine ids among the children of ``path``, keeping their order;
        ``overrides``: engine id to child digit, where it differs from the rule.

        Children with no targets are absent from the result.
        """
        parts: dict[int, list[int]] = {}
        below = self.fanout ** (self.depth - len(path) - 1)
        n_leaves, fanout = self.n_leaves, self.fanout
        if not overrides:
            for eid in engine_ids:
                parts.setdefault((eid % n_leaves // below) % fanout, []).append(eid)
            return parts
        moved = overrides.get
        for eid in engine_ids:
            digit = moved(eid)
            parts.setdefault((eid % n_leaves // below) % fanout if digit is None else digit, []).append(eid)
        return parts

    def layout(self, engine_ids: Iterable[int]) -> dict[Path, list[int]]:
        """Which engines each leaf serves."""
        leaves: dict[Path, list[int]] = {self.leaf_path(i): [] for i in range(self.n_leaves)}
        for eid in sorted(engine_ids):
            leaves[self.leaf_path(self.leaf_of(eid))].append(eid)
        return leaves


# Measured on the 2-core development machine (benchmarks/results/auto-shape.md):
# a relay hop's fixed cost per call (receive, route, send, both ways), and a
# node's cost per engine or child it sends to and hears from (CPU ms per call).
HOP_MS = 1.7
ENGINE_MS = 0.15
MAX_DEPTH = 4
MAX_FANOUT = 64


def modelled_ms(shape: TreeShape, n_engines: int, cores: int, hop_ms=HOP_MS, engine_ms=ENGINE_MS) -> float:
    """Modelled round trip of one call through ``shape``, in ms.

    The slowest path: one hop per level, each node's serial sends to its
    children, and the busiest leaf's engines. All nodes' work must also fit in
    the ``cores`` of the controller's host but one (the hub's): the round trip
    is the larger of the two.
    """
    per_leaf = -(-n_engines // shape.n_leaves)
    path = (shape.depth + 1) * hop_ms + shape.depth * shape.fanout * engine_ms + per_leaf * engine_ms
    internal = shape.n_nodes - shape.n_leaves
    work = shape.n_nodes * hop_ms + (n_engines + internal * shape.fanout) * engine_ms
    return max(path, work / max(1, cores - 1))


def auto_shape(n_engines: int, cores: int, depth=None, fanout=None, hop_ms=HOP_MS, engine_ms=ENGINE_MS) -> TreeShape:
    """The shape with the least ``modelled_ms`` for ``n_engines`` on ``cores``.

    ``depth`` or ``fanout`` given (not None) stays fixed. Ties go to the
    smaller tree (fewer processes). A tree never has more leaves than engines
    to serve.
    """
    best = None
    depths = [depth] if depth is not None else range(MAX_DEPTH + 1)
    fanouts = [fanout] if fanout is not None else range(2, MAX_FANOUT + 1)
    for d in depths:
        for f in fanouts:
            shape = TreeShape(d, f)
            if d and shape.n_leaves > max(1, n_engines) and not (depth is not None and fanout is not None):
                continue
            key = (modelled_ms(shape, n_engines, cores, hop_ms, engine_ms), shape.n_nodes, d)
            if best is None or key < best[0]:
                best = (key, shape)
    if best is None:  # a fixed depth with more leaves than engines: its smallest tree
        return TreeShape(depth, fanout or 2)
    return best[1]


def balanced_id(next_id: int, live_ids: Iterable[int], n_leaves: int) -> int:
    """The smallest id >= ``next_id`` on a leaf with the fewest live engines."""
    load = [0] * n_leaves
    for eid in live_ids:
        load[eid % n_leaves] += 1
    return least_loaded_id(next_id, load)


def least_loaded_id(next_id: int, load: list[int]) -> int:
    """The smallest id >= ``next_id`` on a leaf whose ``load`` (live engines) is least."""
    n_leaves, least = len(load), min(load)
    return min(next_id + (leaf - next_id) % n_leaves for leaf in range(n_leaves) if load[leaf] == least)


def node_name(path: Path) -> str:
    """Human name of a node: 'root', or its digits joined by dots."""
    return "root" if not path else ".".join(map(str, path))


def node_identity(path: Path) -> bytes:
    """zmq identity a node uses on the link to its parent."""
    return b"ipb-node:" + node_name(path).encode()


HOST_PREFIX = b"ipb-host:"


def host_ident(label: str) -> bytes:
    """zmq identity a host relay uses on the link to its leaf."""
    return HOST_PREFIX + label.encode()


def render(shape: TreeShape, engine_ids: Iterable[int], hosts=None) -> str:
    """Text picture of the tree and the engines under each leaf; ``hosts``:
    ``{label: (leaf index, engine ids)}``, host relays and their engines."""
    hosts = hosts or {}
    hosted = {e for _, eids in hosts.values() for e in eids}
    layout = shape.layout(e for e in engine_ids if e not in hosted)
    lines = [f"broadcast tree: depth={shape.depth} fanout={shape.fanout} nodes={shape.n_nodes} leaves={shape.n_leaves}"]
    for path in shape.nodes():
        indent = "  " * len(path)
        label = node_name(path)
        if shape.is_leaf(path):
            eids = layout[path]
            lines.append(f"{indent}{label} (leaf {shape.leaf_index(path)}): engines {eids}")
            for host, (leaf, host_eids) in sorted(hosts.items()):
                if leaf == shape.leaf_index(path):
                    lines.append(f"{indent}  host {host}: engines {sorted(host_eids)}")
        else:
            lines.append(f"{indent}{label}")
    return "\n".join(lines)
