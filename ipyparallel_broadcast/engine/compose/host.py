"""What an engine knows of its host: cores, engines sharing it, its local rank.

Engines of one cluster on one host meet in a directory of lock files
(``HostDir``). Each holds an ``flock`` on ``slot-<rank>`` for its lifetime and
on ``busy-<rank>`` while it runs a request. The kernel drops an ``flock`` when
its process dies, so a SIGKILLed engine frees its slot at once. The directory's
name and removal are ``host.composedir``'s.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import threading

from ...host.composedir import host_path, try_lock, unlock

# (engines on this host, local rank) as set by our launcher, Open MPI and MPICH
# (then Slurm's srun: slurm_hint)
HINTS = [
    ("IPB_COMPOSE_ENGINES", "IPB_COMPOSE_RANK"),
    ("OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("MPI_LOCALNRANKS", "MPI_LOCALRANKID"),
]


def cpu_count() -> int:
    """Usable cores: CPU count, affinity mask and cgroup quota (loky's rules)."""
    import loky  # imported when used: importing it registers an atexit handler,
    # which fails if this runs at interpreter exit (a launcher's stop does)

    return loky.cpu_count(only_physical_cores=False)


def launcher_hint(env=os.environ):
    """``(engines on this host, local rank)`` from the launcher's environment, or None."""
    for size, rank in HINTS:
        if size in env and rank in env:
            try:
                return max(1, int(env[size])), int(env[rank])
            except ValueError:
                continue
    return slurm_hint(env)


def slurm_hint(env=os.environ):
    """``(tasks on this node, SLURM_LOCALID)`` in an ``srun`` step, or None.

    Slurm writes tasks per node compressed, one count per node in node order:
    ``SLURM_STEP_TASKS_PER_NODE=4(x2),3``; ``SLURM_NODEID`` picks ours."""
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if not per_node or "SLURM_LOCALID" not in env:
        return None
    try:
        counts = []
        for part in per_node.split(","):
            count, _, times = part.partition("(x")
            counts += [int(count)] * (int(times.rstrip(")")) if times else 1)
        return max(1, counts[int(env.get("SLURM_NODEID", 0))]), int(env["SLURM_LOCALID"])
    except (ValueError, IndexError):
        return None


def budget_cores(env=os.environ, usable=None) -> int:
    """The cores the engines of this host share: the usable ones (``cpu_count``),
    at most those the scheduler gave the job on this node (``SLURM_CPUS_ON_NODE``:
    tasks there times ``--cpus-per-task``). A node configured with more CPUs than
    it has still gets its real count."""
    cores = cpu_count() if usable is None else usable
    try:
        given = int(env.get("SLURM_CPUS_ON_NODE", 0))
    except ValueError:
        given = 0
    return min(cores, given) if given > 0 else cores


def bound_by_scheduler(env=os.environ, mask=None, total=None) -> bool:
    """True when Slurm bound this task to cores of its own (``--cpu-bind``,
    task/affinity): its affinity mask is narrower than the machine. Its budget
    is then its mask, not a share of the host."""
    kind = env.get("SLURM_CPU_BIND_TYPE", "").strip().lower()
    if not kind or kind.startswith("none"):
        return False
    mask = os.sched_getaffinity(0) if mask is None else mask
    return len(mask) < (total or os.cpu_count() or 1)


class LockFiles:
    """Open file descriptors on ``<dir>/<prefix>-<i>``, kept for the process's life.

    Claims (``fd``) and probes (``held_elsewhere``) use separate open files: an
    ``flock`` belongs to the open file, so a probe's unlock on the claiming
    file would drop a claim another thread had just made on it.
    """

    def __init__(self, path: str, prefix: str):
        self.path, self.prefix = path, prefix
        self.fds: dict[int, int] = {}
        self.probes: dict[int, int] = {}
        self._probing = threading.Lock()  # the watcher thread probes too

    def _open(self, fds: dict, i: int) -> int:
        if i not in fds:
            name = os.path.join(self.path, f"{self.prefix}-{i}")
            fds[i] = os.open(name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        return fds[i]

    def fd(self, i: int) -> int:
        return self._open(self.fds, i)

    def indices(self) -> list:
        """Indices of the files that exist (some other process may have made them)."""
        found = set(self.fds)
        head = self.prefix + "-"
        for name in os.listdir(self.path):
            if name.startswith(head) and name[len(head) :].isdigit():
                found.add(int(name[len(head) :]))
        return sorted(found)

    def held_elsewhere(self, i: int) -> bool:
        """True if a lock is held on file ``i`` by any open file but our probe
        (a claim of ours counts: callers skip their own)."""
        with self._probing:
            fd = self._open(self.probes, i)
            if not try_lock(fd, shared=True):
                return True
            unlock(fd)
            return False

    def close(self):
        with self._probing:
            for fd in [*self.fds.values(), *self.probes.values()]:
                os.close(fd)
            self.fds.clear()
            self.probes.clear()


def survey(key: str, root: str | None = None) -> dict:
    """A look from outside (claiming nothing): engines alive and busy, tokens held."""
    path = host_path(key, root)
    files = {kind: LockFiles(path, kind) for kind in ("slot", "busy", "token")}
    try:
        return {kind: sum(f.held_elsewhere(i) for i in f.indices()) for kind, f in files.items()} | {
            "tokens": len(files["token"].indices())
        }
    except FileNotFoundError:  # the last engine out removed it meanwhile
        return {"slot": 0, "busy": 0, "token": 0, "tokens": 0}
    finally:
        for f in files.values():
            f.close()


class HostDir:
    """This engine's slot and busy mark among the cluster's engines on this host."""

    def __init__(self, key: str, root: str | None = None, rank_hint: int | None = None):
        self.path = host_path(key, root)
        self._alive = self._join()
        self.host = socket.gethostname()
        self.slots = LockFiles(self.path, "slot")
        self.busy = LockFiles(self.path, "busy")
        self.rank = self._claim(rank_hint)
        self._busy_depth = 0

    def _claim(self, hint):
        """The hinted slot if it is free, else the lowest free one."""
        order = ([hint] if hint is not None and hint >= 0 else []) + list(range(10**6))
        for i in order:
            if try_lock(self.slots.fd(i)):
                return i
            os.close(self.slots.fds.pop(i))
        raise RuntimeError(f"no free slot in {self.path}")

    def live_engines(self) -> int:
        """Engines of this cluster alive on this host, this one included."""
        return 1 + sum(self.slots.held_elsewhere(i) for i in self.slots.indices() if i != self.rank)

    def busy_engines(self) -> int:
        """Engines of this cluster running a request on this host, this one counted as busy."""
        others = [i for i in self.busy.indices() if i != self.rank]
        return 1 + sum(self.busy.held_elsewhere(i) for i in others)

    def enter_busy(self):
        if self._busy_depth == 0:
            fcntl.flock(self.busy.fd(self.rank), fcntl.LOCK_EX)
        self._busy_depth += 1

    def leave_busy(self):
        self._busy_depth -= 1
        if self._busy_depth == 0:
            unlock(self.busy.fd(self.rank))

    def _join(self) -> int:
        """A shared lock on the directory's ``alive`` file, in a directory that
        the last engine out is not removing (checked by inode, then retried)."""
        while True:
            os.makedirs(self.path, mode=0o700, exist_ok=True)
            name = os.path.join(self.path, "alive")
            try:
                fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except FileNotFoundError:
                continue
            fcntl.flock(fd, fcntl.LOCK_SH)
            try:
                if os.stat(name).st_ino == os.fstat(fd).st_ino:
                    return fd
            except FileNotFoundError:
                pass
            os.close(fd)

    def close(self):
        """Leave; the last engine of the cluster on this host removes the directory."""
        self.busy.close()
        self.slots.close()
        unlock(self._alive)
        if try_lock(self._alive):
            shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._alive)
