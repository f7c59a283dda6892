"""Local engines forked from one pre-imported template process.

``python -m ipyparallel_broadcast.engine.forked [engine args]`` with ``IPB_FORK_ENGINES=n``:
the template imports the engine's stack (IPython, ipykernel, ipyparallel,
zmq, ours) once, then forks ``n`` engines. A fresh interpreter per
engine imports all of it again (about 0.4 s of CPU each) and keeps its own copy;
forked engines share those pages until they write to them.

Each engine forks its nanny at once, while it has no thread and no zmq context
yet (a fork is only safe then); the nanny waits on a pipe for the settings
ipyparallel's ``start_nanny`` would give a fresh one. The template stays the
engines' parent: it passes SIGTERM, SIGINT and SIGHUP on to them and exits
when they have all exited, with the worst exit status. The launcher is
``BroadcastEngineSetLauncher`` with ``fork = True``.
"""

from __future__ import annotations

import gc
import os
import pickle
import signal
import sys

ENGINES_ENV = "IPB_FORK_ENGINES"
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def preimport():
    """What every engine imports, imported once, before any fork. Not NumPy:
    the compose mode sets thread limits before NumPy's BLAS starts its pool."""
    from ipyparallel.engine import app, kernel, nanny  # noqa: F401

    from . import compose  # noqa: F401
    from . import kernel as ours  # noqa: F401


def fork_nanny():
    """Fork this engine's nanny now; return a ``start_nanny`` that hands it its
    settings and returns ``(url, pipe)`` as ipyparallel's does."""
    settings_r, settings_w = os.pipe()
    url_r, url_w = os.pipe()
    if os.fork() == 0:  # the nanny
        try:
            os.setsid()  # as start_new_session: a signal to the engine's group spares it
            os.close(settings_w)
            os.close(url_r)
            os.dup2(settings_r, 0)
            os.dup2(url_w, 1)
            sys.stdin = os.fdopen(0, "r")
            sys.stdout = os.fdopen(1, "w", buffering=1)  # the url line goes out at once
            from ipyparallel.engine import nanny

            nanny.main()
        finally:
            os._exit(0)
    os.close(settings_r)
    os.close(url_w)

    def start_nanny(**kwargs):
        kwargs["pid"] = os.getpid()
        with os.fdopen(settings_w, "wb") as f:
            f.write(pickle.dumps(kwargs))
        pipe = os.fdopen(url_r, "rb")  # kept open: the nanny watches it close
        url = pipe.readline().decode("utf8").strip()
        if not url:
            raise RuntimeError("nanny failed")
        return url, pipe

    return start_nanny


def run_engine(args, rank: int):
    """In a forked child: become engine ``rank``; never returns."""
    code = 1
    try:
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        import random

        random.seed()  # forked children must not share random streams
        os.environ["IPB_COMPOSE_RANK"] = str(rank)
        from ipyparallel.engine import app

        from .app import BroadcastEngine

        app.start_nanny = fork_nanny()
        BroadcastEngine.launch_instance(args)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main(argv=None):
    args = sys.argv[1:] if argv is None else argv
    n = int(os.environ.get(ENGINES_ENV, "1"))
    first = int(os.environ.get("IPB_COMPOSE_RANK", "0"))
    preimport()
    gc.collect()
    gc.freeze()  # the collector never touches (and so never copies) the template's objects
    children = []
    for i in range(n):
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            run_engine(args, first + i)
        children.append(pid)

    def forward(sig, frame):
        for pid in children:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    worst = 0
    for _ in children:
        while True:
            try:
                _, status = os.wait()
                break
            except InterruptedError:
                continue
        worst = max(worst, abs(os.waitstatus_to_exitcode(status)))
    sys.exit(worst)


if __name__ == "__main__":
    main()
