"""A real cluster spread over a ``NetBed``: the controller on the bed's
controller host, engines (ours, stock ``ipengine``s or simulated) on the
engine hosts, and a client in the test's own process (``BedCluster``); or
``ipcluster start`` on the controller host, as users run it (``IPCluster``).

    with NetBed(hosts=3) as bed, BedCluster(bed, depth=1) as cluster:
        for host in bed.hosts:
            cluster.start_engines(host, 3)
        rc = cluster.client(wait_for=9)
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

import psutil

from .netbed import Host, Managed, NetBed
from .slurmbed import SlurmBed

KEEP_LOGS = "IPB_BED_KEEP_LOGS"  # a folder: each bed cluster's profile (its logs) copied there as it closes

ENGINE_CMDS = {
    "broadcast": [sys.executable, "-m", "ipyparallel_broadcast.engine"],
    "stock": [sys.executable, "-m", "ipyparallel.engine"],
}


class BedCluster(Managed):
    """A broadcast controller on ``bed.controller`` and engines on its hosts."""

    def __init__(
        self,
        bed: NetBed,
        depth=1,
        fanout=2,
        controller_args: Sequence[str] = (),
        log_level: int = 30,
        stock: bool = False,
        kept: int = 0,
    ):
        """``kept``: run the controller under its keeper (``launch.keeper``),
        which restarts it that many times a minute at most (0: no keeper)."""
        self.bed, self.depth, self.fanout, self.kept = bed, depth, fanout, kept
        self.controller_args, self.log_level, self.stock = list(controller_args), log_level, stock
        self._tmp = tempfile.TemporaryDirectory(prefix="ipb-bed-")
        self.profile_dir = self._tmp.name
        self.processes: list[subprocess.Popen] = []
        self.clients = []

    def start(self):
        self.start_controller()

    # ------------------------------------------------------------ processes
    def _log(self, name: str):
        return open(os.path.join(self.profile_dir, f"{name}.log"), "ab")

    def _popen(self, host: Host, argv, name) -> subprocess.Popen:
        with self._log(name) as log:
            p = self.bed.popen(host, argv, stdout=log, stderr=subprocess.STDOUT)
        self.processes.append(p)
        return p

    def keeper_pid(self) -> int:
        """The controller's keeper: the one started, or the one that adopted the
        controller when that one died (the keeper file: ``controller.keeperwatch``)."""
        from ..controller.restarts import read_keeper_file

        if self.controller.poll() is None:
            return self.controller.pid
        found = read_keeper_file(self.keeper_file()).get("keeper")
        return found if isinstance(found, int) and psutil.pid_exists(found) else self.controller.pid

    def keeper_file(self) -> str:
        from ..controller.restarts import keeper_file

        return keeper_file(self.profile_dir)

    def hub_pid(self) -> int | None:
        """The controller's main process (under a keeper: its child, or the one it
        adopted; None between two)."""
        from ..launch.keepsettings import main_process

        try:
            hub = main_process(self.keeper_pid())
        except psutil.NoSuchProcess:
            return None
        return None if hub is None else hub.pid

    def kill_keeper(self) -> int:
        """SIGKILL the controller's keeper: the controller starts one that adopts it."""
        pid = self.keeper_pid()
        os.kill(pid, signal.SIGKILL)
        if pid == self.controller.pid:
            self.controller.wait()
        return pid

    def kill_controller(self, timeout: float = 60) -> int:
        """SIGKILL the controller's main process; its children die with it (its
        pid). Between two of its runs (its keeper starting the next), the next
        one, once it is there."""
        pid, deadline = self.hub_pid(), time.monotonic() + timeout
        while pid is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the controller's keeper started no controller in {timeout} s")
            time.sleep(0.05)  # (the keeper's child appears: no event to wait on)
            pid = self.hub_pid()
        os.kill(pid, signal.SIGKILL)
        if not self.kept:
            self.controller.wait()
        return pid

    def restart_controller(self, timeout: float = 60):
        """Start the controller again, as its launcher would: ``--restore``,
        once what is left of the dead one's process group is gone."""
        from ..launch.keepsettings import group_gone

        if not group_gone(self.controller.pid):
            raise RuntimeError("the dead controller's processes are still there")
        self.start_controller(timeout, restore=True)

    def start_controller(self, timeout: float = 60, restore: bool = False):
        host = self.bed.controller
        if self.stock:
            argv = [
                sys.executable,
                "-m",
                "ipyparallel.controller",
                f"--IPController.broadcast_scheduler_depth={self.depth}",
            ]
        else:
            argv = [
                sys.executable,
                "-m",
                "ipyparallel_broadcast.controller",
                f"--BroadcastController.depth={self.depth}",
                f"--BroadcastController.fanout={self.fanout}",
            ]
        argv += [
            f"--profile-dir={self.profile_dir}",
            f"--ip={host.addr}",
            f"--log-level={self.log_level}",
            "--HeartMonitor.period=800",
            *self.controller_args,
            *(["--restore"] if restore else []),
        ]
        if self.kept:
            argv = [sys.executable, "-m", "ipyparallel_broadcast.launch.keeper", f"--restarts={self.kept}", "--", *argv]
        p = self.controller = self._popen(host, argv, "controller")  # (``ip netns exec`` execs: its pid)
        deadline = time.monotonic() + timeout
        while not (self._file("client") and self._file("engine")):
            if p.poll() is not None:
                raise RuntimeError(f"the controller exited ({p.returncode}); see {self.profile_dir}")
            if time.monotonic() > deadline:
                raise TimeoutError("the controller wrote no connection files")
            time.sleep(0.05)
        self._wait_complete(self._file("client"))
        self._wait_complete(self._file("engine"))

    def _stop_kept(self, timeout: float = 30):
        """SIGTERM to the keeper in charge, passed on to the controller; until both are gone."""
        keeper, hub = self.keeper_pid(), self.hub_pid()
        try:
            os.kill(keeper, signal.SIGTERM)
        except ProcessLookupError:
            return
        for pid in (keeper, hub):
            if pid is None:
                continue
            try:
                psutil.Process(pid).wait(timeout)
            except (psutil.NoSuchProcess, psutil.TimeoutExpired):
                pass

    def _file(self, kind) -> str | None:
        found = glob.glob(os.path.join(self.profile_dir, "security", f"ipcontroller-{kind}.json"))
        return found[0] if found else None

    @staticmethod
    def _wait_complete(path, timeout=10):
        deadline = time.monotonic() + timeout
        while True:
            try:
                with open(path) as f:
                    return json.load(f)
            except ValueError:  # written but not yet whole
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def start_engines(
        self, host: Host, n: int, kind: str = "broadcast", args: Sequence[str] = ()
    ) -> list[subprocess.Popen]:
        """``n`` real engines on ``host``: ``kind`` is "broadcast" (ours) or "stock"."""
        argv = ENGINE_CMDS[kind] + [
            f"--file={self._file('engine')}",
            f"--profile-dir={self.profile_dir}",
            f"--log-level={self.log_level}",
            *args,
        ]
        return [self._popen(host, argv, f"engine-{host.name}-{i}") for i in range(n)]

    def start_sim(self, host: Host, n: int, per_process: int = 512, host_relay: bool = False) -> subprocess.Popen:
        """``n`` simulated engines (``ipyparallel_broadcast.tools.sim``) on ``host``;
        ``host_relay``: behind a relay of their own (``sim --hosts``)."""
        argv = [
            sys.executable,
            "-m",
            "ipyparallel_broadcast.tools.sim",
            self._file("engine"),
            "--engines",
            str(n),
            "--per-process",
            str(per_process),
        ]
        if host_relay:
            argv.append("--hosts")
        return self._popen(host, argv, f"sim-{host.name}")

    def _remove_relay_files(self):
        """Relays killed with their namespaces leave their files on the shared disk."""
        from ..host.link import Place

        path = self._file("engine")
        if path is None:
            return
        with open(path) as f:
            key = json.load(f)["key"].encode()
        for stale in glob.glob(os.path.join(Place.base(), Place.prefix(key) + "*")):
            shutil.rmtree(stale, ignore_errors=True) if os.path.isdir(stale) else os.unlink(stale)

    def client(self, wait_for: int = 0, timeout: float = 120):
        """A client in this (the root) namespace; ``wait_for`` engines first."""
        from ..client.client import Client

        rc = Client(self._file("client"))
        self.clients.append(rc)
        if wait_for:
            rc.wait_for_engines(wait_for, timeout=timeout)
        return rc

    def close(self):
        for rc in self.clients:
            rc.close()
        if self.kept and self.processes:  # an orderly stop first: a keeper SIGKILLed would be replaced
            self._stop_kept()
        for p in self.processes:  # each leads its own group: relay nodes, nannies go too
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        self._remove_relay_files()
        keep = os.environ.get(KEEP_LOGS)
        if keep:  # a run to look into afterwards: the controller's and engines' logs kept
            shutil.copytree(self.profile_dir, os.path.join(keep, os.path.basename(self.profile_dir)))
        self._tmp.cleanup()


class IPCluster:
    """``ipcluster start`` on the bed's controller host, with ``config`` as its
    profile's ``ipcluster_config.py``; ``slurm``: a ``SlurmBed`` or a ``NetBed``
    (no Slurm: no ``SLURM_CONF``, no jobs to wait for)."""

    def __init__(self, slurm: SlurmBed | NetBed, config: str, profile_dir: str | None = None):
        self.slurm = slurm if isinstance(slurm, SlurmBed) else None
        self.bed = slurm.bed if self.slurm else slurm
        self.profile_dir = profile_dir or tempfile.mkdtemp(prefix="ipb-slurm-profile-")
        with open(os.path.join(self.profile_dir, "ipcluster_config.py"), "w") as f:
            f.write(config)
        self.proc: subprocess.Popen | None = None
        self.terminated = False  # stop() had to SIGTERM ipcluster start

    @property
    def security(self) -> str:
        return os.path.join(self.profile_dir, "security")

    def _ipcluster(self, verb, *args) -> subprocess.Popen:
        argv = [sys.executable, "-m", "ipyparallel.cluster", verb, f"--profile-dir={self.profile_dir}", *args]
        return self.bed.popen(  # in the profile: ipcluster writes its batch scripts where it runs
            self.bed.controller,
            argv,
            env=self.slurm.env() if self.slurm else dict(os.environ),
            cwd=self.profile_dir,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def start(self, n: int) -> IPCluster:
        self.proc = self._ipcluster("start", f"--n={n}")
        return self

    def connection_file(self, timeout: float = 120) -> str:
        """The client's connection file, once the controller wrote it."""
        path = os.path.join(self.security, "ipcontroller-client.json")
        deadline = time.monotonic() + timeout
        while not os.path.exists(path):
            if self.proc.poll() is not None:
                raise RuntimeError(f"ipcluster exited ({self.proc.returncode}):\n{self.proc.stdout.read()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no connection file in {timeout} s")
            time.sleep(0.05)
        return path

    def stop(self, terminate_after: float | None = None) -> str:
        """``ipcluster stop``; the output of ``ipcluster start``, once it exited.
        ``terminate_after``: seconds to wait before a SIGTERM (stock ipcluster
        never learns that its Slurm controller job ended); None: wait 60 s, then fail."""
        stop = self._ipcluster("stop")
        out = stop.communicate(timeout=60)[0]
        if stop.returncode:
            raise RuntimeError(f"ipcluster stop failed:\n{out}")
        try:
            return self.proc.communicate(timeout=terminate_after or 60)[0]
        except subprocess.TimeoutExpired:
            if terminate_after is None:
                raise
            self.terminated = True
            self.proc.terminate()
            return self.proc.communicate(timeout=60)[0]

    def leftovers(self, shm_before: set) -> dict:
        """Jobs, processes other than slurmd on the engine hosts, and /dev/shm names not in ``shm_before``."""
        procs = []
        for host in self.bed.hosts:
            for pid in self.bed.pids(host):
                try:
                    with open(f"/proc/{pid}/cmdline") as f:
                        cmd = f.read().replace("\0", " ")
                except OSError:
                    continue
                if not cmd.startswith(("slurmd ", "munged ", "slurmctld ")):
                    procs.append(f"{host.name}: {cmd}")
        jobs = self.slurm.jobs() if self.slurm else []
        return {"jobs": jobs, "procs": procs, "shm": sorted(set(os.listdir("/dev/shm")) - shm_before)}

    def left_behind(self, shm_before: set, timeout: float = 60) -> dict:
        """Once stopped: ``{}`` as soon as nothing is left (host relays linger a few
        seconds), else what still was after ``timeout`` (see ``leftovers``)."""
        deadline = time.monotonic() + timeout
        while True:
            found = {k: v for k, v in self.leftovers(shm_before).items() if v}
            if not found or time.monotonic() > deadline:
                return found
            time.sleep(0.2)
