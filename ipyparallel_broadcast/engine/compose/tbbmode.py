"""TBB mode: every engine on one IPC-coordinated TBB pool, or a clear refusal.

It needs three things, each checked: tbb4py; a ``libirml`` that exports the
RML entry points oneTBB looks up (tbb4py 2022.1-2023.2 ship one that exports
none, and TBB then silently falls back to a private pool per process); and a
BLAS whose threads can run on TBB (MKL does; OpenBLAS and BLIS cannot).
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import json
import os
import subprocess
import sys

from .errors import ComposeError

IRML = "libirml.so.1"
# looked up by oneTBB (rml_tbb.cpp) and by tbb4py's IPC layer
IRML_SYMBOLS = (
    "__TBB_make_rml_server",
    "__TBB_call_with_my_server_info",
    "set_active_sem_name",
    "set_stop_sem_name",
    "release_semaphores",
)
BLAS_PROBE = "import json, numpy, threadpoolctl;print(json.dumps(threadpoolctl.threadpool_info()))"
_monkey = None  # the tbb.Monkey this process runs under, once enabled


def find_irml() -> str | None:
    dirs = [os.path.join(p, "lib") for p in (sys.prefix, sys.base_prefix)]
    dirs += [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    for d in dirs:
        hits = sorted(glob.glob(os.path.join(d, "libirml.so*")))
        if hits:
            return hits[0]
    return None


def missing_symbols(path: str) -> list:
    lib = ctypes.CDLL(path)
    return [name for name in IRML_SYMBOLS if not hasattr(lib, name)]


def blas_layers() -> list:
    """``(internal_api, threading_layer)`` of NumPy's pools if it loads with MKL on TBB."""
    env = dict(os.environ, MKL_THREADING_LAYER="TBB")
    out = subprocess.run(
        [sys.executable, "-c", BLAS_PROBE], env=env, capture_output=True, text=True, timeout=120, check=True
    ).stdout
    return [(p["internal_api"], p.get("threading_layer")) for p in json.loads(out)]


def problems() -> list:
    """Why TBB mode cannot coordinate this engine's threads (empty if it can)."""
    if importlib.util.find_spec("tbb") is None:
        return ["tbb4py is not installed (pip install tbb4py)"]
    found = []
    irml = find_irml()
    if irml is None:
        found.append(f"no {IRML} next to this Python (tbb4py installs it in {sys.prefix}/lib)")
    else:
        missing = missing_symbols(irml)
        if missing:
            found.append(
                f"{irml} does not export {', '.join(missing)}: oneTBB would ignore it and give"
                " each process a private pool (the known break in tbb4py 2022.1-2023.2)"
            )
    try:
        layers = blas_layers()
    except (subprocess.SubprocessError, ValueError) as e:
        return found + [f"could not load NumPy to see its thread pools: {e}"]
    if not any(layer == "tbb" for _, layer in layers):
        seen = ", ".join(f"{api} ({layer})" for api, layer in layers) or "none"
        found.append(f"NumPy's thread pools cannot run on TBB: found {seen}; MKL can")
    return found


def enable(cores: int) -> None:
    """Run this process under ``tbb.Monkey`` with IPC coordination, or raise."""
    global _monkey
    if _monkey is not None:
        return
    if "numpy" in sys.modules:
        raise ComposeError("tbb mode must be chosen when the engine starts, before NumPy loads")
    found = problems()
    if found:
        raise ComposeError("tbb mode is unavailable here:\n  - " + "\n  - ".join(found))
    os.environ.update(IPC_ENABLE="1", MKL_THREADING_LAYER="TBB", NUMBA_THREADING_LAYER="TBB")
    import atexit

    import tbb

    tbb.ipc_enabled = True
    tbb.init_sem_name()
    atexit.register(tbb.tbb_atexit)
    _monkey = tbb.Monkey(max_num_threads=cores)
    _monkey.__enter__()
