#!/usr/bin/env python3
"""Run the asv suites on any SSH-reachable Linux host and copy the results back.

    python gce-scripts/ssh_bench.py user@host --profile vm16 [--port 22] [--identity KEY]
        [--commit HEAD] [--quick] [-b REGEX] [--apt] [--mpi] [--remote-dir DIR]
        [--results-dir benchmarks/asv-results] [--dry-run]

The host needs python3 (with venv), git and gcc, or sudo and ``--apt`` to
install them. The project goes over as a git bundle of ``--commit``.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import remote  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("destination", help="user@host")
    parser.add_argument("--port", type=int, default=22)
    parser.add_argument("--identity", help="private key file (ssh -i)")
    parser.add_argument("--ssh-option", action="append", default=[], help="ssh -o OPTION")
    parser.add_argument("--profile", required=True, help="machine profile (benchmarks/profiles.py)")
    parser.add_argument("--machine", help="asv machine name (default: the host's name)")
    parser.add_argument("--commit", default="HEAD")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("-b", "--bench", action="append", default=[])
    parser.add_argument("--apt", action="store_true", help="install packages and raise limits with sudo")
    parser.add_argument("--mpi", action="store_true", help="build mpi4py there, for the MPI peer suite")
    parser.add_argument("--remote-dir", default="ipb-bench", help="working folder on the host")
    parser.add_argument("--results-dir", default=os.path.join(remote.ROOT, "benchmarks", "asv-results"))
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)
    transport = remote.SSH(args.destination, args.port, args.identity, args.ssh_option)
    shell = remote.Shell(dry_run=args.dry_run)
    commit = remote.resolve_commit(args.commit)
    machine = args.machine or args.destination.rpartition("@")[2]
    archive = remote.run_benchmarks(
        shell,
        transport,
        commit,
        args.profile,
        machine,
        args.results_dir,
        quick=args.quick,
        bench=args.bench,
        apt=args.apt,
        mpi=args.mpi,
        remote_dir=args.remote_dir,
    )
    if not args.dry_run:
        print(f"results of {machine} at {commit[:8]} are in {args.results_dir} ({archive})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
