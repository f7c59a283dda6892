#!/usr/bin/env python3
"""Benchmark on a Google Compute Engine VM: create it, run the asv suites,
copy the results back (and to a GCS bucket), delete it, even on failure.

    python gce-scripts/gce_bench.py --profile vm16 --zone us-central1-a [--project P]
        [--commit HEAD] [--image-family debian-12 --image-project debian-cloud]
        [--bucket gs://BUCKET/PATH] [--keep] [--dry-run]

Each profile of benchmarks/profiles.py has a machine type (16, 32, 64 or 96
vCPUs). ``--dry-run`` prints every gcloud command, in order, without running any.
"""

import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import remote  # noqa: E402

MACHINE_TYPES = {
    "vm16": "n2-standard-16",
    "vm32": "n2-standard-32",
    "vm64": "n2-standard-64",
    "vm96": "n2-standard-96",
}


def create_command(args, instance) -> list:
    cmd = [
        "gcloud",
        "compute",
        "instances",
        "create",
        instance,
        "--zone",
        args.zone,
        "--machine-type",
        args.machine_type or MACHINE_TYPES[args.profile],
        "--image-family",
        args.image_family,
        "--image-project",
        args.image_project,
        "--boot-disk-size",
        args.disk,
        "--labels",
        "purpose=ipb-bench",
    ]
    return cmd + (["--project", args.project] if args.project else [])


def delete_command(args, instance) -> list:
    cmd = ["gcloud", "compute", "instances", "delete", instance, "--zone", args.zone, "--quiet"]
    return cmd + (["--project", args.project] if args.project else [])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", required=True, choices=sorted(MACHINE_TYPES))
    parser.add_argument("--zone", required=True)
    parser.add_argument("--project")
    parser.add_argument("--machine-type", help="default: the profile's (n2-standard-16 ... -96)")
    parser.add_argument("--image-family", default="debian-12")
    parser.add_argument("--image-project", default="debian-cloud")
    parser.add_argument("--disk", default="100GB")
    parser.add_argument("--instance", help="default: ipb-bench-PROFILE-COMMIT-TIME")
    parser.add_argument("--commit", default="HEAD")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("-b", "--bench", action="append", default=[])
    parser.add_argument("--results-dir", default=os.path.join(remote.ROOT, "benchmarks", "asv-results"))
    parser.add_argument("--bucket", help="also copy the results archive to gs://BUCKET/PATH")
    parser.add_argument("--ssh-attempts", type=int, default=30, help="tries before the VM counts as unreachable")
    parser.add_argument("--ssh-pause", type=float, default=10, help="seconds between tries")
    parser.add_argument("--keep", action="store_true", help="do not delete the VM afterwards")
    parser.add_argument("--dry-run", action="store_true", help="print the gcloud commands, run nothing")
    args = parser.parse_args(argv)

    commit = remote.resolve_commit(args.commit)
    instance = args.instance or f"ipb-bench-{args.profile}-{commit[:8]}-{int(time.time())}"
    shell = remote.Shell(dry_run=args.dry_run)
    transport = remote.GCloud(instance, args.zone, args.project)
    machine = f"gce-{args.machine_type or MACHINE_TYPES[args.profile]}"
    shell(create_command(args, instance))
    try:
        remote.wait_for_ssh(shell, transport, args.ssh_attempts, args.ssh_pause)
        archive = remote.run_benchmarks(
            shell,
            transport,
            commit,
            args.profile,
            machine,
            args.results_dir,
            quick=args.quick,
            bench=args.bench,
            apt=True,
            mpi=True,
        )
        if args.bucket:
            shell(["gcloud", "storage", "cp", archive, args.bucket.rstrip("/") + "/"])
    finally:
        if args.keep:
            print(f"kept {instance}; delete it with: {' '.join(delete_command(args, instance))}")
        else:
            try:
                shell(delete_command(args, instance))
            except subprocess.CalledProcessError as e:
                print(f"could not delete {instance} ({e}); delete it by hand", file=sys.stderr)
                raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
