"""Thread limits of the native pools (BLAS, OpenMP, numexpr, numba), and affinity.

Before NumPy is imported the limits are environment variables, read by each
library when it loads. Afterwards they go through one cached threadpoolctl
controller, rebuilt only when another numeric library has been imported.
"""

from __future__ import annotations

import os
import sys

from threadpoolctl import ThreadpoolController

# read once, when each library loads
ENV_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "NUMBA_NUM_THREADS",
)
# idle pool threads spin before they sleep (OpenBLAS ~0.1 s, Intel OpenMP 200 ms), taking
# cores from other engines' work: engines that share a host spin ~0.4 ms and 0 ms
QUIET_WAITS = {"OPENBLAS_THREAD_TIMEOUT": "20", "KMP_BLOCKTIME": "0"}
# modules whose import can load another pool
NUMERIC_MODULES = ("numpy", "scipy", "numexpr", "numba", "sklearn", "torch", "mkl")


def numeric_loaded() -> tuple:
    return tuple(m for m in NUMERIC_MODULES if m in sys.modules)


def set_env(n: int, cap: int | None = None, env=os.environ) -> None:
    """Start every pool that has not loaded yet with ``n`` threads, and
    short spin-waits. Numba cannot grow past its start count, so it gets
    ``cap`` (default ``n``)."""
    for var in ENV_VARS:
        env[var] = str(cap or n) if var == "NUMBA_NUM_THREADS" else str(n)
    for var, value in QUIET_WAITS.items():
        env.setdefault(var, value)


class Pools:
    """The native thread pools loaded in this process, via threadpoolctl."""

    def __init__(self):
        self._seen = None
        self._controller = None

    @property
    def controller(self) -> ThreadpoolController:
        loaded = numeric_loaded()
        if loaded != self._seen:
            self._controller, self._seen = ThreadpoolController(), loaded
        return self._controller

    def get(self) -> list:
        return [lib.num_threads for lib in self.controller.lib_controllers]

    def set(self, n) -> list:
        """Set all pools to ``n`` threads (an int, or one per pool); return the old counts."""
        libs = self.controller.lib_controllers
        counts = n if isinstance(n, list) else [n] * len(libs)
        old = []
        for lib, count in zip(libs, counts):
            old.append(lib.num_threads)
            if old[-1] != count:
                lib.set_num_threads(count)
        return old

    def info(self) -> list:
        """``[{api, threading layer, threads, library}]`` of each loaded pool."""
        return [
            {
                "internal_api": lib.internal_api,
                "threading_layer": getattr(lib, "threading_layer", None),
                "num_threads": lib.num_threads,
                "filepath": lib.filepath,
            }
            for lib in self.controller.lib_controllers
        ]


def os_threads() -> int:
    """This process's OS threads, from ``/proc/self/status``."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise RuntimeError("no Threads: line in /proc/self/status")


def core_slice(cores: list, rank: int, width: int) -> list:
    """The ``width`` cores of local rank ``rank``, wrapping round the core list."""
    width = max(1, min(width, len(cores)))
    start = (rank * width) % len(cores)
    return [cores[(start + k) % len(cores)] for k in range(width)]


def pin(cores: list) -> None:
    os.sched_setaffinity(0, cores)


def affinity() -> list:
    return sorted(os.sched_getaffinity(0))
