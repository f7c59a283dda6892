"""Real workloads, after IPython Parallel's examples (the thesis's future work,
section 7.3), each written the natural way for a DirectView-like view: the
same code runs on DirectView, ipyparallel's BroadcastView and ours.

- ``options``: Monte Carlo option pricing (``examples/options``): push the
  market parameters, ``map`` the pricing kernel over the strikes, gather the
  prices;
- ``rmt``: random-matrix eigenvalue spacings (``examples/rmt``): scatter one
  seed per engine, compute, pull each engine's histogram and add them up;
- ``sweep``: a parameter sweep, ``map`` over a grid;
- ``progress``: engines publish progress with ``publish_data`` while they
  work; the client reads ``ar.data`` until the call is done.

Sizes are small (a 2-core machine runs them at 16 engines): the point is the
cost of moving the work, not the work.
"""

from __future__ import annotations

import time

import numpy as np
from ipyparallel import interactive

STRIKES_PER_ENGINE = 4
PATHS, STEPS = 2000, 50
RMT_MATRICES, RMT_SIZE = 20, 32
BINS = np.linspace(0, 4, 41)
SWEEP = [(a, b) for a in np.linspace(0.1, 2, 32) for b in np.linspace(0.1, 2, 32)]
PROGRESS_STEPS = 5


# ------------------------------------------------------------------ engine side
@interactive
def price(strike):
    """An Asian and a European call on one strike (``S``, ``sigma``, ``r``,
    ``days`` pushed first), as the options example's kernel prices them."""
    import numpy as np

    rng = np.random.default_rng(int(strike * 1000))
    dt = days / 365.0 / STEPS  # noqa: F821 (pushed)
    shocks = rng.standard_normal((PATHS, STEPS)) * sigma * np.sqrt(dt) + (r - 0.5 * sigma**2) * dt  # noqa: F821
    paths = S * np.exp(np.cumsum(shocks, axis=1))  # noqa: F821
    discount = np.exp(-r * days / 365.0)  # noqa: F821
    european = discount * np.maximum(paths[:, -1] - strike, 0).mean()
    asian = discount * np.maximum(paths.mean(axis=1) - strike, 0).mean()
    return float(european), float(asian)


@interactive
def spacings_histogram():
    """Normalised eigenvalue spacings of ``RMT_MATRICES`` random symmetric
    matrices (seeded by the scattered ``seed``), as one histogram."""
    import numpy as np

    rng = np.random.default_rng(seed)  # noqa: F821 (scattered)
    diffs = []
    for _ in range(RMT_MATRICES):
        a = rng.standard_normal((RMT_SIZE, RMT_SIZE))
        ev = np.linalg.eigvalsh(a + a.T)
        d = np.diff(ev)[RMT_SIZE // 4 : -RMT_SIZE // 4]
        diffs.append(d / d.mean())
    return np.histogram(np.concatenate(diffs), BINS)[0]


def response(point):
    """One point of the sweep: a damped oscillator's energy after a few steps."""
    import math

    damping, stiffness = point
    x, v = 1.0, 0.0
    for _ in range(200):
        v += (-stiffness * x - damping * v) * 0.01
        x += v * 0.01
    return 0.5 * (v * v + stiffness * x * x) + 0 * math.pi


def publish_progress(steps):
    from ipyparallel.datapub import publish_data

    for k in range(steps):
        publish_data({"done": k + 1})
    return steps


# ------------------------------------------------------------------ client side
def options(view) -> list:
    view.push(dict(S=100.0, sigma=0.25, r=0.05, days=260, PATHS=PATHS, STEPS=STEPS), block=True)
    strikes = list(np.linspace(80, 120, STRIKES_PER_ENGINE * len(view)))
    return view.map_sync(price, strikes)


def rmt(view) -> np.ndarray:
    view.push(dict(RMT_MATRICES=RMT_MATRICES, RMT_SIZE=RMT_SIZE, BINS=BINS), block=True)
    view.scatter("seed", list(range(len(view))), flatten=True, block=True)
    return np.sum(view.apply_sync(spacings_histogram), axis=0)


def sweep(view) -> list:
    return view.map_sync(response, SWEEP)


def progress(view) -> int:
    """Watch ``ar.data`` until the call is done, as ipyparallel's
    ``publish_data`` example does; the engines whose last step had arrived
    by then (a view that holds the result until the data is in gives all)."""
    ar = view.apply_async(publish_progress, PROGRESS_STEPS)
    while not ar.ready():
        ar.wait(0.005)
        _ = ar.data  # what a progress display would read
    data = ar.data if isinstance(ar.data, list) else [ar.data]
    return sum(isinstance(d, dict) and d.get("done") == PROGRESS_STEPS for d in data)


WORKLOADS = {"options": options, "rmt": rmt, "sweep": sweep, "progress": progress}


def timed(fn):
    """``view -> seconds`` for one run of a workload."""

    def run(view) -> float:
        tic = time.perf_counter()
        fn(view)
        return time.perf_counter() - tic

    run.__name__ = f"t_{fn.__name__}"
    return run
