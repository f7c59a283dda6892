"""The host's claim on its relay: engines on their way hold it, a relay leaving takes it.

A host relay with no engine leaves after its grace. On a loaded host an engine
that has just started the relay may take longer than that to send its first
request (64 simulated hosts at nice 10 on two cores lost 23 relays so, and their
engines waited for ever). So an engine holds the claim lock shared from before
it starts the relay until it has joined it (an engine that dies drops it with
its process). A relay leaves only if it can take the lock exclusively, and it
holds it until it is gone: an engine that claims meanwhile waits, then starts
the next relay. No file per engine, no pid to check, no window between the two.
"""

from __future__ import annotations

import os
import time

from .composedir import try_lock

CLAIM_WAIT = 0.05  # seconds between tries while a relay is leaving


def _open_current(path: str) -> int:
    """The lock file at ``path`` now (a leaving relay unlinks it)."""
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


def claim(path: str, timeout: float) -> int:
    """Hold the claim (shared); its descriptor, for ``release``. Waits while
    a relay is leaving, at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        fd = _open_current(path)
        if try_lock(fd, shared=True):
            try:  # the file a leaving relay unlinked is no claim on the next relay
                if os.fstat(fd).st_ino == os.stat(path).st_ino:
                    return fd
            except FileNotFoundError:
                pass
        os.close(fd)
        if time.monotonic() >= deadline:
            raise TimeoutError(f"the host relay holding {path} did not leave in {timeout:g} s")
        time.sleep(CLAIM_WAIT)


def release(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


def leave(path: str) -> int | None:
    """For a relay with no engine: the claim lock, held exclusively until the
    process ends, or None if an engine holds the claim (the relay stays)."""
    fd = _open_current(path)
    if try_lock(fd):
        return fd  # kept open: held until the relay's process is gone
    os.close(fd)
    return None
