"""gce-scripts: the exact gcloud and ssh commands, in order, and the VM is
deleted even when a step fails. A stand-in ``gcloud`` on PATH records its
calls (this machine cannot reach Google Cloud); the runner itself is tested
for real over OpenSSH in ``gce-scripts/tests/``."""

import os
import shlex
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.cluster

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GCE = os.path.join(ROOT, "gce-scripts", "gce_bench.py")
SSH = os.path.join(ROOT, "gce-scripts", "ssh_bench.py")


def head() -> str:
    """The commit the scripts take by default, read when a test runs (not at import: a commit
    made while the suite runs moves it)."""
    return subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=ROOT, text=True).strip()


@pytest.fixture
def fake_gcloud(tmp_path):
    """A ``gcloud`` that logs each call; it fails when its arguments contain $FAIL_ON."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "calls.log"
    script = bindir / "gcloud"
    script.write_text(
        "#!/usr/bin/env bash\n"
        f'printf "%s\\n" "$*" >> {shlex.quote(str(log))}\n'
        'if [[ -n "$FAIL_ON" && "$*" == *"$FAIL_ON"* ]]; then echo "failed: $FAIL_ON" >&2; exit 1; fi\n'
    )
    script.chmod(0o755)
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return env, log


def run(script, *args, env=None, check=True):
    return subprocess.run(
        [sys.executable, script, *args], cwd=ROOT, env=env, text=True, capture_output=True, check=check
    )


def commands(stdout):
    return [shlex.split(line) for line in stdout.splitlines() if line and not line.startswith("#")]


def test_gce_dry_run_prints_the_whole_lifecycle_and_runs_nothing(fake_gcloud):
    env, log = fake_gcloud
    out = run(
        GCE,
        "--profile",
        "vm32",
        "--zone",
        "europe-west4-a",
        "--project",
        "p1",
        "--instance",
        "vm",
        "--bucket",
        "gs://b/runs",
        "-b",
        "Farm",
        "--dry-run",
        env=env,
    ).stdout
    cmds = commands(out)
    assert not log.exists()  # nothing ran
    assert all(c[0] == "gcloud" for c in cmds)
    create, wait, mkdir, bundle, runner, bench, back, bucket, delete = cmds
    assert create[:5] == ["gcloud", "compute", "instances", "create", "vm"]
    flags = dict(zip(create[5::2], create[6::2]))
    assert flags["--machine-type"] == "n2-standard-32" and flags["--zone"] == "europe-west4-a"
    assert flags["--image-family"] == "debian-12" and flags["--image-project"] == "debian-cloud"
    assert flags["--project"] == "p1"
    assert wait[:4] == ["gcloud", "compute", "ssh", "vm"] and wait[-2:] == ["--command", "true"]
    assert "retried" in out
    assert bundle[:3] == ["gcloud", "compute", "scp"] and bundle[-1] == "vm:ipb-bench/ipb.bundle"
    assert runner[-1] == "vm:ipb-bench/remote-run.sh"
    remote = shlex.split(bench[-1])
    assert remote[:2] == ["bash", "ipb-bench/remote-run.sh"]
    opts = dict(zip(remote[2::2], remote[3::2]))
    assert opts["--commit"] == head() and opts["--profile"] == "vm32" and opts["--bench"] == "Farm"
    assert {"--apt", "--mpi"} <= set(remote)  # a fresh VM: packages, limits, MPI
    assert back[-2].startswith("vm:ipb-bench/work/ipb-results-") and back[-2].endswith(".tar.gz")
    assert bucket[:3] == ["gcloud", "storage", "cp"] and bucket[-1] == "gs://b/runs/"
    assert delete == [
        "gcloud",
        "compute",
        "instances",
        "delete",
        "vm",
        "--zone",
        "europe-west4-a",
        "--quiet",
        "--project",
        "p1",
    ]


@pytest.mark.parametrize("step", ["--command true", "remote-run.sh", "scp"])
def test_the_vm_is_deleted_when_a_step_fails(fake_gcloud, step):
    env, log = fake_gcloud
    env = dict(env, FAIL_ON=step)
    done = run(
        GCE,
        "--profile",
        "vm16",
        "--zone",
        "us-central1-a",
        "--instance",
        "vm",
        "--ssh-attempts",
        "3",
        "--ssh-pause",
        "0",
        env=env,
        check=False,
    )
    calls = log.read_text().splitlines()
    assert done.returncode != 0
    assert calls[0].startswith("compute instances create vm")
    assert calls[-1] == "compute instances delete vm --zone us-central1-a --quiet"
    if step == "--command true":  # the VM never answered: tried again and again, then given up
        assert sum("--command true" in c for c in calls) == 3


def test_gce_keep_leaves_the_vm_and_says_how_to_delete_it(fake_gcloud):
    env, log = fake_gcloud
    out = run(GCE, "--profile", "vm16", "--zone", "z", "--instance", "vm", "--keep", "--dry-run", env=env).stdout
    assert "instances delete" not in "\n".join(c for c in out.splitlines() if not c.startswith("kept"))
    assert "kept vm; delete it with: gcloud compute instances delete vm --zone z --quiet" in out


def test_ssh_dry_run_uses_port_key_and_options():
    out = run(
        SSH,
        "bench@host.example",
        "--port",
        "2222",
        "--identity",
        "/k/id",
        "--ssh-option",
        "StrictHostKeyChecking=no",
        "--profile",
        "vm64",
        "--quick",
        "--dry-run",
    ).stdout
    cmds = commands(out)
    assert [c[0] for c in cmds] == ["ssh", "scp", "scp", "ssh", "scp"]
    for c in cmds:
        port = "-p" if c[0] == "ssh" else "-P"
        assert c[c.index(port) + 1] == "2222" and c[c.index("-i") + 1] == "/k/id"
        assert "StrictHostKeyChecking=no" in c and "BatchMode=yes" in c
    remote = shlex.split(cmds[3][-1])
    assert "--quick" in remote and remote[remote.index("--machine") + 1] == "host.example"
    assert "--apt" not in remote  # any host: nothing installed unless asked


@pytest.mark.skipif(shutil.which("gcloud") is None, reason="the gcloud CLI is not installed here")
def test_every_gcloud_flag_exists_in_the_installed_cli(fake_gcloud):
    """Where the real gcloud is installed, its own help knows every flag we pass."""
    env, _ = fake_gcloud
    out = run(
        GCE,
        "--profile",
        "vm96",
        "--zone",
        "z",
        "--project",
        "p",
        "--instance",
        "vm",
        "--bucket",
        "gs://b",
        "--dry-run",
        env=env,
    ).stdout
    seen = set()
    for cmd in commands(out):
        group = []
        for word in cmd[1:]:
            if word.startswith("-") or "/" in word or ":" in word or word == "vm":
                break
            group.append(word)
        group = tuple(group)
        if group in seen:
            continue
        seen.add(group)
        help_text = subprocess.run(
            [shutil.which("gcloud"), *group, "--help"],
            capture_output=True,
            text=True,
            env=dict(os.environ, CLOUDSDK_CORE_DISABLE_PROMPTS="1"),
        ).stdout
        for flag in (w for w in cmd if w.startswith("--")):
            assert flag in help_text, f"{' '.join(group)} has no {flag}"
