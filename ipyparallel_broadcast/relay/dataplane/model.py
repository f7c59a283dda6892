"""An alpha-beta model of broadcasting M bytes to P hosts, to choose a host tree.

A message of ``n`` bytes over one link costs ``alpha + n * beta``: ``alpha``
is the fixed cost of one message at one hop (latency, and a relay's work on
it), ``beta`` the seconds per byte (1 / bandwidth). A host sends one message
at a time on its link (one port), so k copies cost k messages; hosts work in
parallel. The wire floor is ``M * beta``
(one copy over one link); the lower bound of any broadcast is
``ceil(log2 P) * alpha + M * beta``.

Shapes (``estimate``):
- ``star``: the root sends every host its copy: ``P * (alpha + M * beta)``
  (the controller host's link carries P copies);
- ``tree k``: a k-ary tree, store-and-forward: each level waits for the whole
  message, then its hosts send k copies: ``depth * k * (alpha + M * beta)``;
- ``pipelined tree k``: the same tree in S chunks, each forwarded as soon as
  it arrives (cut-through). A pipeline of D stages, each costing
  ``a + w / S`` per chunk, runs in ``(D + S - 1) * (a + w / S)``, least at
  ``S* = sqrt((D - 1) * w / a)``: about ``(sqrt((D - 1) * a) + sqrt(w))**2``.
  Here ``D = depth``, ``a = k * alpha`` and ``w = k * M * beta`` (k = 1: a
  chain, ``depth = P``);
- ``two trees``: Sanders, Speck and Traeff's: two binary trees, each with
  half of the chunks, every host interior in one and a leaf in the other, so
  each sends about one copy in all: ``w = M * beta``, ``D = 2 * L``, where
  ``L = floor(log2 P) + 1`` is a balanced binary tree's levels of hosts under
  the root (each level's hop taken at half the link's rate: the two trees
  share it).

MPI's own figures (``mpi_bounds``): the lower bound above, and MPICH's
scatter then ring allgather for large messages:
``(log2 P + P - 1) * alpha + 2 * (P - 1) / P * M * beta``.

``best`` picks the least estimated time, chunks included; ``predict`` gives
the table in the docs. The bed measures ``alpha`` and ``beta``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Link:
    alpha: float  # seconds per message per hop
    beta: float  # seconds per byte

    @classmethod
    def of(cls, alpha: float, bits_per_second: float) -> Link:
        return cls(alpha, 8.0 / bits_per_second)


TEN_GBIT = Link.of(2e-4, 10e9)  # a data-center link, for the docs' predictions


@dataclass(frozen=True)
class Estimate:
    shape: str
    seconds: float
    chunks: int = 1  # 1: whole messages (store-and-forward)
    root_copies: float = 1.0  # copies that leave the root's host


def depth_of(p: int, k: int) -> int:
    """Levels of hosts in a complete k-ary tree of ``p`` hosts under the root
    (the root's host is not one of them)."""
    if k == 1:
        return p
    depth, reached, width = 0, 0, 1
    while reached < p:
        width *= k
        reached += width
        depth += 1
    return depth


def pipeline(stages: int, work: float, alpha: float, max_chunks: int | None = None) -> tuple[float, int]:
    """(seconds, chunks) of ``stages`` pipelined stages moving ``work`` seconds of bytes each."""
    if stages <= 1 or alpha <= 0:
        return alpha + work, 1
    best_real = math.sqrt((stages - 1) * work / alpha)
    options = {max(1, math.floor(best_real)), max(1, math.ceil(best_real))}  # the cost is convex in s
    if max_chunks:
        options = {min(s, max_chunks) for s in options}
    return min(((stages + s - 1) * (alpha + work / s), s) for s in options)


def estimate(shape: str, p: int, m: float, link: Link, k: int = 2, max_chunks: int | None = None) -> Estimate:
    a, mb = link.alpha, m * link.beta
    if shape == "star":
        return Estimate(shape, p * (a + mb), 1, p)
    if shape == "tree":
        return Estimate(f"tree {k}", depth_of(p, k) * k * (a + mb), 1, min(k, p))
    if shape == "pipelined tree":
        seconds, s = pipeline(depth_of(p, k), k * mb, k * a, max_chunks)
        return Estimate(f"pipelined tree {k}", seconds, s, min(k, p))
    if shape == "two trees":
        seconds, s = pipeline(2 * p.bit_length(), mb, a, max_chunks)
        return Estimate(shape, seconds, s, 1)
    raise ValueError(f"unknown shape {shape!r}")


def candidates(p: int, m: float, link: Link, max_chunks: int | None = None) -> list[Estimate]:
    out = [estimate("star", p, m, link)]
    for k in range(1, min(p, 32) + 1):
        if k > 1:
            out.append(estimate("tree", p, m, link, k))
        out.append(estimate("pipelined tree", p, m, link, k, max_chunks))
    out.append(estimate("two trees", p, m, link, max_chunks=max_chunks))
    return out


def best(p: int, m: float, link: Link, shapes=None, max_chunks: int | None = None) -> Estimate:
    """The least estimated time among ``shapes`` (name prefixes; default all)."""
    found = [
        e for e in candidates(p, m, link, max_chunks) if shapes is None or any(e.shape.startswith(s) for s in shapes)
    ]
    return min(found, key=lambda e: (e.seconds, e.root_copies))


def mpi_bounds(p: int, m: float, link: Link) -> dict[str, float]:
    a, mb = link.alpha, m * link.beta
    log_p = math.ceil(math.log2(max(p, 2)))
    return {"lower bound": log_p * a + mb, "MPICH scatter + allgather": (log_p + p - 1) * a + 2 * (p - 1) / p * mb}


def predict(hosts=(100, 1000, 10000), m: float = 2**30, link: Link = TEN_GBIT) -> list[dict]:
    """Rows for the docs: per host count, each family's best and MPI's figures, in floors."""
    floor = m * link.beta
    rows = []
    for p in hosts:
        row = {"hosts": p, "floor": floor}
        for family in ("star", "tree", "pipelined tree", "two trees"):
            e = best(p, m, link, [family])
            row[family] = (e.seconds / floor, e.shape, e.chunks)
        row.update({k: v / floor for k, v in mpi_bounds(p, m, link).items()})
        rows.append(row)
    return rows


# ------------------------------------------------------ the way back, and round
# A reduce is a broadcast run backwards: the same pipelines, each host folding
# its chunk into the passing one (at memory speed: not modelled), so each
# family costs what its broadcast does. An allreduce is a reduce, then a
# broadcast of the result; run one after the other (as the product does), or
# overlapped, when each host's link then carries both streams (w doubles).
# Lower bounds: a reduce, as a broadcast; an allreduce, ``ceil(log2 P) * alpha +
# 2 * (P - 1) / P * M * beta`` (Patarasuk and Yuan's bandwidth bound). MPICH
# (large messages, Rabenseifner): a reduce is a reduce-scatter then a gather,
# ``2 * log2 P * alpha + 2 * (P - 1) / P * M * beta``; an allreduce a
# reduce-scatter then an allgather, the same; a ring allreduce (NCCL's),
# ``2 * (P - 1) * (alpha + M * beta / P)``.


def collective_bounds(p: int, m: float, link: Link) -> dict[str, float]:
    a, mb = link.alpha, m * link.beta
    log_p = math.ceil(math.log2(max(p, 2)))
    share = 2 * (p - 1) / p * mb
    return {
        "reduce lower bound": log_p * a + mb,
        "allreduce lower bound": log_p * a + share,
        "MPICH reduce": 2 * log_p * a + share,
        "MPICH allreduce": 2 * log_p * a + share,
        "ring allreduce": 2 * (p - 1) * (a + mb / p),
    }


def allreduce_estimate(family: str, p: int, m: float, link: Link, max_chunks: int | None = None) -> float:
    """``family``'s reduce, then its broadcast (``"chain, then pipelined tree"``:
    the product's), or both overlapped (``"two trees, overlapped"``)."""
    if family == "chain, then pipelined tree":
        reduce = estimate("pipelined tree", p, m, link, 1, max_chunks).seconds
        return reduce + best(p, m, link, ["pipelined tree"], max_chunks).seconds
    if family == "two trees, overlapped":
        stages = 4 * p.bit_length()
        return pipeline(stages, 2 * m * link.beta, link.alpha, max_chunks)[0]
    raise ValueError(f"unknown allreduce {family!r}")


def predict_collectives(hosts=(100, 1000, 10000), m: float = 2**30, link: Link = TEN_GBIT) -> list[dict]:
    """Rows for the docs: per host count, reduce and allreduce by each way, in
    multiples of their own lower bounds."""
    rows = []
    for p in hosts:
        bounds = collective_bounds(p, m, link)
        low_r, low_a = bounds["reduce lower bound"], bounds["allreduce lower bound"]
        row = {"hosts": p}
        row["reduce: chain"] = estimate("pipelined tree", p, m, link, 1).seconds / low_r
        row["reduce: pipelined tree"] = best(p, m, link, ["pipelined tree"]).seconds / low_r
        row["reduce: two trees"] = estimate("two trees", p, m, link).seconds / low_r
        row["reduce: MPICH"] = bounds["MPICH reduce"] / low_r
        for family in ("chain, then pipelined tree", "two trees, overlapped"):
            row[f"allreduce: {family}"] = allreduce_estimate(family, p, m, link) / low_a
        row["allreduce: ring"] = bounds["ring allreduce"] / low_a
        row["allreduce: MPICH"] = bounds["MPICH allreduce"] / low_a
        rows.append(row)
    return rows
