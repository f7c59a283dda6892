"""Composable threading for engines that share a host.

On an engine (or any process; ``key`` names the group of processes)::

    from ipyparallel_broadcast import compose
    compose.configure("counting", requests=True)
    with compose.threads() as n:      # n threads for this block, n >= 1
        np.linalg.eig(a)

    @compose.threaded                 # the same, as a decorator
    def work(a): ...

From a client: ``rc.broadcast_view().compose(mode="counting")`` and
``view.apply_sync(compose.status)``. Engines started by this project run the
static mode unless told otherwise (``--BroadcastEngine.compose=...``).
"""

from __future__ import annotations

import functools

from .errors import ComposeError
from .runtime import MODES, Runtime

__all__ = ["MODES", "ComposeError", "configure", "runtime", "status", "threaded", "threads"]

_runtime = None


def runtime() -> Runtime:
    """This process's runtime (made on first use, in the default mode)."""
    global _runtime
    if _runtime is None:
        _runtime = Runtime()
    return _runtime


def configure(mode="static", **settings) -> dict:
    """Switch this process's mode (see ``Runtime.configure``); returns ``status()``."""
    return runtime().configure(mode, **settings)


def threads(n=None, block=None):
    """``with threads() as k:`` run a block with ``k`` threads, as the mode allows."""
    return runtime().threads(n, block)


def threaded(fn=None, *, n=None, block=None):
    """Decorator: run each call of ``fn`` inside ``threads(n, block)``."""
    if fn is None:
        return functools.partial(threaded, n=n, block=block)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with threads(n, block):
            return fn(*args, **kwargs)

    return wrapper


def status() -> dict:
    """This engine's mode, budget, tokens, thread pools and live OS thread count."""
    return runtime().status()
