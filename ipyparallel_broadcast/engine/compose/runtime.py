"""The engine's composable runtime: one per process, configured by mode.

- ``default``: the libraries' own thread counts (one per core, in every engine).
- ``static``: each engine gets ``max(1, cores * factor // engines on its host)``
  threads, optionally pinned to its own slice of cores.
- ``counting``: engines rest at the static budget; a ``threads()`` region
  takes extra threads from the host's token pool, as many as are free and
  fair (cores / busy engines), and never waits for them.
- ``tbb``: one IPC-coordinated TBB pool (``tbbmode``); refused if unusable.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from contextlib import contextmanager

from ...host import composedir
from . import host as H
from . import limits as L
from .errors import ComposeError
from .regions import Counting
from .tokens import TokenPool

MODES = ("default", "static", "counting", "tbb")
RECOUNT_EVERY = 1.0  # seconds between recounts of a host's live engines


class Runtime:
    def __init__(self):
        self.mode = "default"
        self.factor, self.pin, self.requests, self.strict = 1.0, False, False, False
        self.host = self.counting = None
        self.fixed_engines = None  # engine count given by the caller
        self.floor = 1  # engines the launcher said it started on this host
        self.engines = 1
        self.pools = L.Pools()
        self.cores = H.budget_cores()
        self.bound = H.bound_by_scheduler()  # a mask of its own: not shared with the host's engines
        self.original_affinity = L.affinity()
        self.original_env = {v: os.environ.get(v) for v in L.ENV_VARS + tuple(L.QUIET_WAITS)}
        self._lock = threading.Lock()
        self._depth = 0
        self._recounted = 0.0
        self.nested = 0

    # -- configuration ---------------------------------------------------

    def configure(
        self,
        mode="static",
        *,
        key=None,
        factor=1.0,
        pin=False,
        requests=False,
        strict=False,
        rebalance=0.01,
        settle=0.05,
        engines=None,
        rank=None,
        root=None,
    ) -> dict:
        """Switch this process to ``mode``; return ``status()``."""
        if mode not in MODES:
            raise ComposeError(f"compose mode must be one of {MODES}, not {mode!r}")
        if not factor > 0:
            raise ComposeError(f"compose factor must be > 0, not {factor!r}")
        if pin and mode != "static":
            raise ComposeError(f"pinning is for static mode only; {mode} mode moves threads across cores")
        if mode == "tbb":
            from . import tbbmode

            tbbmode.enable(self.cores)
        hint = H.launcher_hint()
        if mode != "default" and self.host is None:
            composedir.sweep_unused(root)  # what engines gone without their exit handlers left
            self.host = H.HostDir(_key(key), root, rank if rank is not None else hint and hint[1])
            atexit.register(self.close)
        self.mode, self.factor, self.pin = mode, float(factor), bool(pin)
        self.requests, self.strict = bool(requests), bool(strict)
        self.fixed_engines = engines or None
        self.floor = hint[0] if hint else 1
        self._count_engines(force=True)
        if mode == "counting" and self.counting is None:
            tokens = TokenPool(self.host.path, self.cores, start=self.host.rank)
            self.counting = Counting(self.host, tokens, self.pools, self.cores)
        if self.counting is not None:
            self.counting.interval, self.counting.settle = rebalance, settle
        self._apply()
        kernel = _running_kernel()
        if kernel is not None:
            self.attach(kernel)
        return self.status()

    @property
    def budget(self) -> int:
        """Threads per engine outside regions."""
        if self.mode in ("default", "tbb"):
            return self.cores
        return max(1, int(self.cores * self.factor) // (1 if self.bound else self.engines))

    def _count_engines(self, force=False):
        if self.host is None:
            self.engines = 1
        elif self.fixed_engines:
            self.engines = self.fixed_engines
        elif force or time.monotonic() - self._recounted > RECOUNT_EVERY:
            self._recounted = time.monotonic()
            before, self.engines = self.engines, max(self.floor, self.host.live_engines())
            return before != self.engines
        return False

    def _apply(self):
        """Put the budget in force: the environment, loaded pools, affinity."""
        if self.mode == "default":
            for var, value in self.original_env.items():
                if value is None:
                    os.environ.pop(var, None)
                else:
                    os.environ[var] = value
        elif self.mode != "tbb":
            L.set_env(self.budget, cap=self.cores)
        if L.numeric_loaded():
            self.pools.set(self.budget)
        if self.pin and self.host is not None:
            L.pin(L.core_slice(self.original_affinity, self.host.rank, self.budget))
        elif L.affinity() != self.original_affinity:
            L.pin(self.original_affinity)

    # -- regions ---------------------------------------------------------

    @contextmanager
    def threads(self, n=None, block=None):
        """Run the block with as many threads as the mode allows (yielded).

        In counting mode: up to ``n`` (default all cores) tokens, fair share
        only, at least one thread, waiting for a token only if ``block`` (or
        the runtime is ``strict``); rebalanced while it runs (``regions``).
        A region inside a region runs 1 thread.
        """
        with self._lock:
            nested, self._depth = self._depth > 0, self._depth + 1
        try:
            if nested:
                self.nested += 1
                counting = self.counting
                if counting is not None:
                    counting.hold += 1
                old = self.pools.set(1)
                try:
                    yield 1
                finally:
                    self.pools.set(old)
                    if counting is not None:
                        counting.hold -= 1
            elif self.mode == "counting":
                block = self.strict if block is None else block
                with self._busy(), self.counting.region(n, block, self.budget) as k:
                    yield k
            else:
                yield self.budget
        finally:
            with self._lock:
                self._depth -= 1

    @contextmanager
    def _busy(self):
        self.host.enter_busy()
        try:
            yield
        finally:
            self.host.leave_busy()

    def refresh(self):
        """Before each request: a new budget if the host's engine count changed."""
        if self.mode in ("static", "counting") and self._count_engines():
            self._apply()

    @contextmanager
    def request(self):
        """Around each request the engine runs (see ``attach``)."""
        self.refresh()
        if self.mode != "counting":
            yield
        elif self.requests:
            with self.threads():
                yield
        else:
            with self._busy():
                yield

    def attach(self, kernel) -> None:
        """Run each of ``kernel``'s apply and execute requests inside ``request()``:
        our kernel does it itself (``compose_runtime``); any other's methods are wrapped."""
        if hasattr(kernel, "compose_runtime"):
            kernel.compose_runtime = self
            return
        if getattr(kernel, "_ipb_compose", None) is self:
            return
        kernel._ipb_compose = self
        apply, execute = kernel.do_apply, kernel.do_execute

        def do_apply(*args, **kwargs):
            if self.mode != "counting":  # nothing around the call: no context manager
                self.refresh()
                return apply(*args, **kwargs)
            with self.request():
                return apply(*args, **kwargs)

        async def do_execute(*args, **kwargs):
            with self.request():
                return await execute(*args, **kwargs)

        kernel.do_apply, kernel.do_execute = do_apply, do_execute

    def close(self):
        """Give back tokens and slot; the last engine out removes the host directory."""
        if self.counting is not None:
            self.counting.close()
            self.counting.tokens.close()
            self.counting = None
        if self.host is not None:
            self.host.close()
            self.host = None
        self.mode = "default"

    # -- introspection ---------------------------------------------------

    def status(self) -> dict:
        """Budget, tokens, pools and live thread counts of this engine."""
        tokens, stats = None, {"regions": 0, "peak_threads": 0, "last_threads": None}
        if self.counting is not None:
            pool = self.counting.tokens
            tokens = {"total": pool.size, "free": pool.free(), "held": len(pool.held)}
            stats = self.counting.stats
        return {
            "pid": os.getpid(),
            "host": self.host.host if self.host else os.uname().nodename,
            "mode": self.mode,
            "cores": self.cores,
            "engines_on_host": self.engines,
            "launcher_engines": self.floor,  # engines the launcher (or srun, mpiexec) said share the host
            "rank": self.host.rank if self.host else None,
            "factor": self.factor,
            "budget": self.budget,
            "pinned": self.pin,
            "affinity": L.affinity(),
            "requests": self.requests,
            "strict": self.strict,
            "tokens": tokens,
            "busy_engines": self.host.busy_engines() if self.host and self.mode == "counting" else None,
            "pools": self.pools.info(),
            "os_threads": L.os_threads(),
            "nested": self.nested,
            **stats,
        }


def _running_kernel():
    """The kernel of the engine this process is, if it is one."""
    kernelbase = sys.modules.get("ipykernel.kernelbase")
    if kernelbase is not None and kernelbase.Kernel.initialized():
        return kernelbase.Kernel.instance()
    return None


def _key(key):
    """The cluster key: given, from the environment, or from the engine's session."""
    if key:
        return key
    if os.environ.get("IPB_COMPOSE_KEY"):
        return os.environ["IPB_COMPOSE_KEY"]
    kernel = _running_kernel()
    if kernel is not None:
        return composedir.cluster_key(kernel.session.key)
    raise ComposeError("no cluster key: pass key=..., set IPB_COMPOSE_KEY or run in an engine")
