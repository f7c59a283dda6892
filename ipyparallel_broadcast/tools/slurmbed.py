"""A real Slurm on a ``NetBed``: ``munged`` and ``slurmctld`` on the controller
host, one ``slurmd`` (one Slurm node) in each engine host's namespace.

    with NetBed(hosts=3) as bed, SlurmBed(bed, cpus=4) as slurm:
        subprocess.run(["sbatch", ...], env=slurm.env())
        cluster = IPCluster(slurm, "c.Cluster.engine_launcher_class = 'broadcast-slurm'").start(12)
        ...  (bedcluster.IPCluster)

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
        self._daemon(self.bed.controller, argv, "munged")  # in a namespace: the bed kills it whatever happens
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
