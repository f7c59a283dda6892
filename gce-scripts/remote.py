"""Run the asv suites on a remote host and bring the results back.

The steps are the same for any host; only the transport differs: plain
``ssh``/``scp`` (``SSH``) or ``gcloud compute ssh``/``scp`` (``GCloud``).
``Shell`` runs each command, or with ``dry_run`` only prints it, exactly as it
would run (one shell-quoted line per command).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RUNNER = os.path.join(HERE, "remote-run.sh")


@dataclass
class Shell:
    dry_run: bool = False
    log: list[list[str]] = field(default_factory=list)

    def __call__(self, cmd: Sequence[str], capture: bool = False, check: bool = True) -> str:
        cmd = [str(c) for c in cmd]
        self.log.append(cmd)
        print(("" if self.dry_run else "+ ") + shlex.join(cmd), flush=True)
        if self.dry_run:
            return ""
        done = subprocess.run(cmd, text=True, stdout=subprocess.PIPE if capture else None)
        if check and done.returncode:
            raise subprocess.CalledProcessError(done.returncode, cmd, done.stdout)
        return done.stdout if capture else ""


@dataclass
class SSH:
    """Any host reachable with OpenSSH: ``user@host``, port and key as options."""

    destination: str
    port: int = 22
    identity: str | None = None
    options: Sequence[str] = ()

    def _opts(self, port_flag: str) -> list[str]:
        opts = [port_flag, str(self.port), "-o", "BatchMode=yes"]
        for option in self.options:
            opts += ["-o", option]
        return opts + (["-i", self.identity] if self.identity else [])

    def ssh(self, command: str) -> list[str]:
        return ["ssh", *self._opts("-p"), self.destination, command]

    def put(self, local: str, remote: str) -> list[str]:
        return ["scp", *self._opts("-P"), local, f"{self.destination}:{remote}"]

    def get(self, remote: str, local: str) -> list[str]:
        return ["scp", *self._opts("-P"), f"{self.destination}:{remote}", local]


@dataclass
class GCloud:
    """A Compute Engine instance, through ``gcloud compute ssh``/``scp``."""

    instance: str
    zone: str
    project: str | None = None

    def _where(self) -> list[str]:
        return ["--zone", self.zone] + (["--project", self.project] if self.project else [])

    def ssh(self, command: str) -> list[str]:
        return ["gcloud", "compute", "ssh", self.instance, *self._where(), "--quiet", "--command", command]

    def put(self, local: str, remote: str) -> list[str]:
        return ["gcloud", "compute", "scp", *self._where(), "--quiet", local, f"{self.instance}:{remote}"]

    def get(self, remote: str, local: str) -> list[str]:
        return ["gcloud", "compute", "scp", *self._where(), "--quiet", f"{self.instance}:{remote}", local]


def resolve_commit(commit: str) -> str:
    return subprocess.check_output(["git", "rev-parse", commit], cwd=ROOT, text=True).strip()


def make_bundle(commit: str, directory: str) -> str:
    """A git bundle holding ``commit`` (the remote host needs no access to a git server)."""
    path = os.path.join(directory, "ipb.bundle")
    subprocess.run(["git", "bundle", "create", "-q", path, commit, "--branches", "--tags"], cwd=ROOT, check=True)
    return path


def wait_for_ssh(shell: Shell, transport, attempts: int = 30, pause: float = 10) -> None:
    """Retry a trivial command until the host answers (a new VM boots first)."""
    if shell.dry_run:
        print(f"# the next command is retried every {pause:.0f} s until the host answers (at most {attempts} times)")
    for attempt in range(attempts):
        try:
            shell(transport.ssh("true"))
            return
        except subprocess.CalledProcessError:
            if attempt == attempts - 1:
                raise
            time.sleep(pause)


def run_benchmarks(
    shell: Shell,
    transport,
    commit: str,
    profile: str,
    machine: str,
    results_dir: str,
    quick: bool = False,
    bench: Sequence[str] = (),
    apt: bool = False,
    mpi: bool = False,
    remote_dir: str = "ipb-bench",
) -> str:
    """Ship the commit and the runner, run it, copy the results into
    ``results_dir`` (one folder per machine, as asv lays them out). Returns
    the local archive's path."""
    with tempfile.TemporaryDirectory(prefix="ipb-remote-") as tmp:
        bundle = make_bundle(commit, tmp) if not shell.dry_run else os.path.join(tmp, "ipb.bundle")
        shell(transport.ssh(f"mkdir -p {remote_dir}"))
        shell(transport.put(bundle, f"{remote_dir}/ipb.bundle"))
        shell(transport.put(RUNNER, f"{remote_dir}/remote-run.sh"))
        args = [
            "bash",
            f"{remote_dir}/remote-run.sh",
            "--bundle",
            f"{remote_dir}/ipb.bundle",
            "--commit",
            commit,
            "--profile",
            profile,
            "--machine",
            machine,
            "--workdir",
            f"{remote_dir}/work",
        ]
        args += ["--quick"] if quick else []
        args += ["--apt"] if apt else []
        args += ["--mpi"] if mpi else []
        for regex in bench:
            args += ["--bench", regex]
        output = shell(transport.ssh(shlex.join(args)), capture=True)
        if shell.dry_run:
            archive = f"{remote_dir}/work/ipb-results-{machine}-{commit[:8]}.tar.gz"
        else:
            sys.stdout.write(output)
            archive = next(
                line.split(" ", 1)[1] for line in reversed(output.splitlines()) if line.startswith("RESULTS ")
            )
        kept = os.path.join(results_dir, os.path.basename(archive))
        if not shell.dry_run:
            os.makedirs(results_dir, exist_ok=True)
        shell(transport.get(archive, kept))
        if not shell.dry_run:
            unpack(kept, results_dir)
        return kept


def unpack(archive: str, results_dir: str) -> None:
    """Extract ``asv-results/...`` from the archive into ``results_dir``."""
    os.makedirs(results_dir, exist_ok=True)
    with tarfile.open(archive) as tar:
        members = []
        for member in tar.getmembers():
            head, _, rest = member.name.partition("/")
            if head == "asv-results" and rest:
                member.name = rest
                members.append(member)
        tar.extractall(results_dir, members=members, filter="data")
