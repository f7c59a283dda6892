"""Run on engines by the soak's workload: each call appends its token to a log
of the engine that ran it (``$IPB_CHAOS_LOG/<pid>-<engine>.log``), so a call
that runs twice on one engine shows twice in one file."""

from __future__ import annotations

import os

LOG_ENV = "IPB_CHAOS_LOG"


def log(token: str, engine=None) -> None:
    folder = os.environ.get(LOG_ENV)
    if not folder:
        return
    name = f"{os.getpid()}-{engine if engine is not None else 'e'}.log"
    with open(os.path.join(folder, name), "a") as f:
        f.write(token + "\n")


def logged(token: str):
    """apply: the token back, once logged (the checker matches it to its call)."""
    log(token)
    return token


def one(token: str) -> int:
    """reduce (sum): 1 per engine."""
    log(token)
    return 1


def big_one(token: str, n: int):
    """reduce (sum) of big values: an array of n ones per engine."""
    import numpy as np

    log(token)
    return np.ones(n)


def execute_code(token: str) -> str:
    """execute: log (simulated engines name themselves by ``engine_id``) and print."""
    return (
        "import ipyparallel_broadcast.tools.chaos.engine_side as _chaos\n"
        f"_chaos.log({token!r}, globals().get('engine_id'))\n"
        f"print({token!r})\n"
    )
