"""A real Slurm on a ``NetBed``: ``munged`` and ``slurmctld`` on the controller
host, one ``slurmd`` (one Slurm node) in each engine host's namespace.

    with NetBed(hosts=3) as bed, SlurmBed(bed, cpus=4) as slurm:
        subprocess.run(["sbatch", ...], env=slurm.env())
        cluster = IPCluster(slurm, "c.Cluster.engine_launcher_class = 'broadcast-slurm'").start(12)
        rc = ipb.Client(cluster.connection_file())
        ...
        cluster.stop()

Everything lives under one temporary directory: ``slurm.conf`` (the
environment's ``SLURM_CONF``), a munge key and socket, spool and state
directories, and the daemons' logs. Nodes are named ``h1``, ``h2``, ... like
the bed's hosts, each at its namespace's address. ``available()`` says why
Slurm cannot run here (not root, Debian's ``slurm-wlm``/``munge`` missing).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

from .netbed import Managed, NetBed

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "srun", "sinfo")

CONF = """\
ClusterName=ipbbed
SlurmctldHost={hostname}({ctl_addr})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MinJobAge=2
KillWait=2
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
{nodes}
PartitionName=bed Nodes={names} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
"""


class SlurmBedError(RuntimeError):
    pass


class SlurmBed(Managed):
    """Slurm over ``bed``: ``cpus`` Slurm CPUs per node (more than the host has is fine)."""

    def __init__(self, bed: NetBed, cpus: int = 4):
        self.bed, self.cpus = bed, cpus
        self.root = ""
        self.procs: list[subprocess.Popen] = []

    @staticmethod
    def available() -> str | None:
        """None if Slurm can run on a bed here, else why not."""
        missing = [d for d in DAEMONS if shutil.which(d) is None and not os.path.exists(f"/usr/sbin/{d}")]
        if missing:
            return f"Slurm needs Debian's slurm-wlm and munge ({', '.join(missing)} not found)"
        return NetBed.available()

    @property
    def conf(self) -> str:
        return os.path.join(self.root, "slurm.conf")

    @property
    def munge_socket(self) -> str:
        return os.path.join(self.root, "munge", "munge.socket")

    def env(self, **extra) -> dict:
        """The environment for Slurm's commands (and what they start)."""
        return dict(os.environ, SLURM_CONF=self.conf, **extra)

    # ----------------------------------------------------------- lifecycle
    def start(self, timeout: float = 60):
        self.root = tempfile.mkdtemp(prefix="ipb-slurm-")
        os.chmod(self.root, 0o755)
        for sub in ["state", "munge"] + [f"spool/{h.name}" for h in self.bed.hosts]:
            os.makedirs(os.path.join(self.root, sub))
        self._write_conf()
        self._start_munge()
        ctl = self.bed.controller
        self._daemon(ctl, ["slurmctld", "-D", "-i", "-f", self.conf], "slurmctld")
        self.wait(lambda: self._run(["sinfo", "-h"], check=False).returncode == 0, timeout, "slurmctld to answer")
        for host in self.bed.hosts:
            self._daemon(host, ["slurmd", "-D", "-N", host.name, "-f", self.conf], f"slurmd-{host.name}")
        self.wait(self._all_idle, timeout, "every node idle")

    def close(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in reversed(self.procs):
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.clear()
        if self.root:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = ""

    # ------------------------------------------------------------- helpers
    def _write_conf(self):
        nodes = "\n".join(
            f"NodeName={h.name} NodeAddr={h.addr} NodeHostname={h.name} CPUs={self.cpus} State=UNKNOWN"
            for h in self.bed.hosts
        )
        text = CONF.format(
            hostname=os.uname().nodename,
            ctl_addr=self.bed.controller.addr,
            root=self.root,
            munge_socket=self.munge_socket,
            nodes=nodes,
            names=",".join(h.name for h in self.bed.hosts),
        )
        with open(self.conf, "w") as f:
            f.write(text)

    def _start_munge(self):
        d = os.path.join(self.root, "munge")
        key = os.path.join(d, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(128))
        os.chmod(key, 0o400)
        argv = [
            "munged",
            "-F",
            "--force",
            f"--socket={self.munge_socket}",
            f"--key-file={key}",
            f"--pid-file={d}/munged.pid",
            f"--seed-file={d}/munged.seed",
            f"--log-file={d}/munged.log",
        ]
        self._daemon(None, argv, "munged")
        self.wait(lambda: os.path.exists(self.munge_socket), 10, "munged's socket")

    def _daemon(self, host, argv, name) -> subprocess.Popen:
        with open(os.path.join(self.root, f"{name}.out"), "ab") as out:
            kw = dict(stdout=out, stderr=subprocess.STDOUT, env=self.env(), start_new_session=True)
            # nsenter, not ``ip netns exec``: that remounts /sys, hiding the cgroups slurmd needs
            enter = ["nsenter", f"--net=/run/netns/{host.netns}"] if host else []
            p = subprocess.Popen(enter + argv, **kw)
        self.procs.append(p)
        return p

    def _run(self, argv, check=True) -> subprocess.CompletedProcess:
        return subprocess.run(argv, capture_output=True, text=True, env=self.env(), check=check)

    def _all_idle(self) -> bool:
        out = self._run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False).stdout.split()
        states = dict(zip(out[::2], out[1::2]))
        return len(states) == len(self.bed.hosts) and all(s == "idle" for s in states.values())

    def jobs(self) -> list[str]:
        """The ids of jobs Slurm still has (pending, running or completing)."""
        return self._run(["squeue", "-h", "-o", "%i"]).stdout.split()

    def wait(self, done, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while not done():
            dead = [p.args for p in self.procs if p.poll() is not None]
            if dead:
                raise SlurmBedError(f"{dead[0]} exited while waiting for {what}; logs in {self.root}")
            if time.monotonic() > deadline:
                raise SlurmBedError(f"timed out waiting for {what}; logs in {self.root}")
            time.sleep(0.1)


class IPCluster:
    """``ipcluster start`` on the bed's controller host (Slurm's commands at
    hand), with ``config`` as its profile's ``ipcluster_config.py``."""

    def __init__(self, slurm: SlurmBed, config: str, profile_dir: str | None = None):
        self.slurm, self.bed = slurm, slurm.bed
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
            env=self.slurm.env(),
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
                raise SlurmBedError(f"ipcluster exited ({self.proc.returncode}):\n{self.proc.stdout.read()}")
            if time.monotonic() > deadline:
                raise SlurmBedError(f"no connection file in {timeout} s")
            time.sleep(0.05)
        return path

    def stop(self, terminate_after: float | None = None) -> str:
        """``ipcluster stop``; the output of ``ipcluster start``, once it exited.
        ``terminate_after``: seconds to wait before a SIGTERM (stock ipcluster
        never learns that its Slurm controller job ended); None: wait 60 s, then fail."""
        stop = self._ipcluster("stop")
        out = stop.communicate(timeout=60)[0]
        if stop.returncode:
            raise SlurmBedError(f"ipcluster stop failed:\n{out}")
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
                if not cmd.startswith("slurmd "):
                    procs.append(f"{host.name}: {cmd}")
        return {"jobs": self.slurm.jobs(), "procs": procs, "shm": sorted(set(os.listdir("/dev/shm")) - shm_before)}
