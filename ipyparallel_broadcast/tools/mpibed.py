"""MPICH's hydra across a ``NetBed``: ``mpiexec`` on one host starts ranks on
the others.

    with NetBed(hosts=3) as bed:
        hydra = Hydra(bed, tmpdir)
        argv = ["mpiexec", *hydra.args([(h, 4) for h in bed.hosts]), "-n", "12", ...]
        bed.popen(bed.controller, argv)

Hydra reaches each host through its ``rsh`` launcher, here a script that enters
the host's network namespace and a UTS namespace of its own named for the host
(MPICH tells nodes apart by hostname, which the bed's hosts share); its
proxies connect back to ``mpiexec`` over the bed's bridge. ``UCX_TLS=tcp,self``
keeps every byte between hosts on the hosts' links.
"""

from __future__ import annotations

import os
import shutil

from .netbed import Host, NetBed

LAUNCHER = """#!/bin/sh
# hydra's launcher: <host> <command...> runs in that host's network namespace,
# in a UTS namespace of its own named for the host (MPICH tells nodes apart by name)
host="$1"; shift
case "$host" in
{cases}
  *) echo "unknown host $host" >&2; exit 1;;
esac
# (the command comes as rsh would pass it: one string for a shell)
exec ip netns exec "$ns" unshare --uts sh -c \\
  'hostname "$0"; export UCX_TLS=tcp,self UCX_NET_DEVICES=eth0; eval "exec $1"' "$host" "$*"
"""


def mpiexec() -> str | None:
    """MPICH's hydra ``mpiexec``, or None."""
    return shutil.which("mpiexec.hydra") or shutil.which("mpiexec")


def available() -> str | None:
    """None if hydra can run across a bed here, else why not."""
    if mpiexec() is None:
        return "MPI across the bed needs MPICH (Debian's mpich: mpiexec.hydra)"
    return NetBed.available()


class Hydra:
    """A launcher script and host files for ``bed``, written in ``directory``."""

    def __init__(self, bed: NetBed, directory: str):
        self.bed, self.directory = bed, directory
        self.launcher = os.path.join(directory, "launcher.sh")
        hosts = [bed.controller] + bed.hosts
        with open(self.launcher, "w") as f:
            f.write(LAUNCHER.format(cases="\n".join(f"  {h.name}) ns={h.netns};;" for h in hosts)))
        os.chmod(self.launcher, 0o755)

    def args(self, ranks: list[tuple[Host, int]], name: str = "hosts") -> list[str]:
        """``mpiexec`` arguments placing ``k`` ranks on each ``(host, k)``, in order."""
        hostfile = os.path.join(self.directory, name)
        with open(hostfile, "w") as f:
            f.write("".join(f"{h.name}:{k}\n" for h, k in ranks))
        return [
            "-f", hostfile, "-launcher", "rsh", "-launcher-exec", self.launcher,
            "-localhost", self.bed.controller.addr, "-genv", "UCX_TLS", "tcp,self",
        ]  # fmt: skip
