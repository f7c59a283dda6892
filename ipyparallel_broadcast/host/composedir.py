"""Where a cluster's engines on one host meet to share its cores: the compose
directory (``engine.compose.host.HostDir`` fills it with lock files).

Engines leave it with their exit handlers, the last one out removing it. An
engine killed before its handlers ran leaves it behind, so whoever outlives
the engines (our launcher, the host relay, the next engine to start) removes
it once no engine holds its ``alive`` lock: ``remove_if_unused``.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import shutil
import tempfile

ROOT_ENV = "IPB_COMPOSE_DIR"  # where host directories live (default /dev/shm or the temp dir)


def cluster_key(secret: bytes) -> str:
    """A name shared by a cluster's engines: a digest of its session key."""
    return hashlib.sha256(b"ipyparallel-broadcast compose\0" + secret).hexdigest()[:16]


def default_root() -> str:
    if ROOT_ENV in os.environ:
        return os.environ[ROOT_ENV]
    shm = "/dev/shm"
    return shm if os.access(shm, os.W_OK) else tempfile.gettempdir()


def try_lock(fd: int, shared: bool = False) -> bool:
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EACCES):
            return False
        raise
    return True


def unlock(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)


def host_path(key: str, root: str | None = None) -> str:
    return os.path.join(root or default_root(), f"ipb-compose-{os.getuid()}-{key}")


def remove_if_unused(key: str, root: str | None = None) -> bool:
    """Remove a cluster's host directory if no engine is in it (engines killed
    before their exit handlers ran leave it behind); True if removed."""
    path = host_path(key, root)
    try:
        fd = os.open(os.path.join(path, "alive"), os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        if not try_lock(fd):  # an engine holds its shared lock
            return False
        shutil.rmtree(path, ignore_errors=True)
        return True
    finally:
        os.close(fd)


def sweep_unused(root: str | None = None) -> list[str]:
    """Remove every host directory of this user that no engine is in: engines
    killed, or stopped past their exit handlers (``rc.shutdown``), under a
    launcher that does not clean up after them, leave theirs. Their keys."""
    root = root or default_root()
    head = f"ipb-compose-{os.getuid()}-"
    try:
        names = os.listdir(root)
    except OSError:
        return []
    return [n[len(head) :] for n in names if n.startswith(head) and remove_if_unused(n[len(head) :], root)]
