"""The model's choices for one push (``model``): its shape (a chain, a k-ary
tree, or two trees) and its chunk size, on the link as this node measured it.

``plan_push`` takes the least estimated time among the pipelined trees of
fanout 1 to 4; two trees only where the model puts them ``MARGIN`` ahead (the
reduce's margin, measured on the bed). The chunk count is the pipeline's best
(``model.pipeline``), so chunks shrink where hops are many or the link slow,
and grow where per-chunk costs would dominate.

``Gauge`` is the link: until a push was timed, a data-center link; then the
fastest of the last pushes timed, each solved for ``beta`` from the pipeline's
time, ``(stages + chunks - 1) * (alpha + M * beta / chunks)``. A push whose
engines took long (a slow function) only looks like a slower link, and the
fastest of several wins, so such a push does not set the chunk size.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .chunks import count
from .model import Link, depth_of, estimate
from .plans import CHAIN, TWO_TREES

MIN_CHUNK = 64 << 10
MAX_CHUNK = 4 << 20  # (1,000 hosts of 10 Gbit/s, 1 GiB: the model's best is ~3.7 MiB)
STEP = 64 << 10  # chunk sizes are whole multiples of this
HOP = 2e-4  # alpha: a chunk's fixed cost at one hop (latency, and a relay's work on it), seconds
START = Link(HOP, 8 / 10e9)  # the link assumed before a push was timed: 10 Gbit/s
# Two trees only where the model puts them this far ahead of the best tree. On the bed
# (200 Mbit/s, 2 cores for every host), a reduce's two trees measured from 2 % faster
# to 20 % slower than a chain at 8 and 16 hosts, where the model put them 0 to 15 %
# ahead: each host must have both halves' first bytes at once, and its engines' turns
# to combine them share the cores. So the model must put them well ahead first.
MARGIN = 1.5
ASSUMED = Link.of(1e-3, 1e9)  # the link a reduce's way is chosen for (only its alpha/beta ratio counts)
TIMED = 8  # pushes the gauge remembers
FANOUTS = range(1, 5)
TREE = "tree"


@dataclass(frozen=True)
class PushPlan:
    shape: str  # CHAIN, TREE (k-ary) or TWO_TREES
    fanout: int  # hosts each host feeds (two trees: 2, in each tree)
    chunk: int  # bytes per chunk
    stages: int  # hops of the pipeline (the gauge's)

    @property
    def trees(self) -> int:
        return 2 if self.shape == TWO_TREES else 1


SHAPES = ("auto", CHAIN, TWO_TREES)


def plan_push(
    n_hosts: int, nbytes: int, link: Link = START, fanout: int = 0, chunk: int = 0, shape: str = "auto"
) -> PushPlan:
    """The fastest way the model finds for ``nbytes`` to ``n_hosts``
    (``fanout``, ``chunk``, ``shape``: fixed by settings; 0 or "auto": chosen)."""
    fixed = count(nbytes, chunk) if chunk else None
    fanout = 1 if shape == CHAIN else fanout
    trees = [estimate("pipelined tree", n_hosts, nbytes, link, k, fixed) for k in ([fanout] if fanout else FANOUTS)]
    k, tree = min(enumerate(trees, start=fanout or 1), key=lambda kt: kt[1].seconds)
    two = estimate("two trees", n_hosts, nbytes, link, max_chunks=fixed)
    if shape == TWO_TREES or (not fanout and n_hosts > 2 and tree.seconds >= MARGIN * two.seconds):
        shape, k, best, stages = TWO_TREES, 2, two, 2 * n_hosts.bit_length()
    else:
        shape, best, stages = (CHAIN if k == 1 else TREE), tree, depth_of(n_hosts, k)
    if not chunk:
        chunk = min(MAX_CHUNK, max(MIN_CHUNK, STEP * count(count(nbytes, best.chunks), STEP)))
    return PushPlan(shape, k, chunk, stages)


class Gauge:
    """The link pushes from this node cross, as measured (``link``)."""

    def __init__(self, start: Link = START):
        self.start = start
        self.betas: deque[float] = deque(maxlen=TIMED)

    def timed(self, nbytes: int, seconds: float, stages: int, chunks: int) -> None:
        """A push of ``nbytes`` in ``chunks`` over ``stages`` hops took ``seconds``."""
        if nbytes <= 0 or chunks <= 0:
            return
        beta = (seconds / (stages + chunks - 1) - self.start.alpha) * chunks / nbytes
        if beta > 0:
            self.betas.append(beta)

    @property
    def link(self) -> Link:
        return Link(self.start.alpha, min(self.betas)) if self.betas else self.start

    @property
    def bits_per_second(self) -> float:
        return 8 / self.link.beta
