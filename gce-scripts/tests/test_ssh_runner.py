"""The on-host runner, for real: a throwaway OpenSSH server on localhost (free
port, fresh host and user keys), ``ssh_bench.py`` ships the commit, installs
it in a fresh environment there, runs a quick asv subset and brings the
result files back. Run by ``.ci/run`` (it takes a few minutes, so it is not
part of ``./test.sh``)."""

import getpass
import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def sshd(tmp_path):
    if not os.path.exists(SSHD):
        pytest.skip("OpenSSH server not installed (apt-get install openssh-server)")
    for name in ("host", "user"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", tmp_path / name], check=True)
    (tmp_path / "authorized_keys").write_text((tmp_path / "user.pub").read_text())
    port, user = free_port(), getpass.getuser()
    config = tmp_path / "sshd_config"
    config.write_text(f"""Port {port}
ListenAddress 127.0.0.1
HostKey {tmp_path / "host"}
AuthorizedKeysFile {tmp_path / "authorized_keys"}
PidFile {tmp_path / "sshd.pid"}
AllowUsers {user}
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
Subsystem sftp internal-sftp
""")
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # privilege separation
    server = subprocess.Popen([SSHD, "-D", "-e", "-f", config], stderr=open(tmp_path / "sshd.log", "w"))
    options = ["-o", "StrictHostKeyChecking=no", "-o", f"UserKnownHostsFile={tmp_path / 'known_hosts'}"]
    login = [
        "ssh",
        "-p",
        str(port),
        "-i",
        tmp_path / "user",
        "-o",
        "BatchMode=yes",
        *options,
        f"{user}@127.0.0.1",
        "true",
    ]
    deadline = time.monotonic() + 30
    while subprocess.run(login, capture_output=True).returncode:
        assert server.poll() is None, (tmp_path / "sshd.log").read_text()
        assert time.monotonic() < deadline, "sshd did not accept a login"
        time.sleep(0.3)
    yield dict(
        destination=f"{user}@127.0.0.1",
        port=port,
        key=str(tmp_path / "user"),
        options=["StrictHostKeyChecking=no", f"UserKnownHostsFile={tmp_path / 'known_hosts'}"],
    )
    server.terminate()
    server.wait(10)


@pytest.mark.timeout(1800)
def test_runner_over_ssh_runs_asv_there_and_brings_results_back(sshd, tmp_path):
    results = tmp_path / "results"
    cmd = [
        sys.executable,
        os.path.join(ROOT, "gce-scripts", "ssh_bench.py"),
        sshd["destination"],
        "--port",
        str(sshd["port"]),
        "--identity",
        sshd["key"],
        "--profile",
        "ci",
        "--quick",
        "-b",
        "TreeDepth",
        "--machine",
        "ssh-localhost",
        "--remote-dir",
        str(tmp_path / "remote"),
        "--results-dir",
        str(results),
    ]
    for option in sshd["options"]:
        cmd += ["--ssh-option", option]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-5000:]
    assert "RESULTS " in done.stdout and "asv exit status: 0" in done.stdout
    commit = subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=ROOT, text=True).strip()
    machine = results / "ssh-localhost"
    assert json.loads((machine / "machine.json").read_text())["machine"] == "ssh-localhost"
    (result_file,) = [p for p in glob.glob(str(machine / "*.json")) if not p.endswith("machine.json")]
    data = json.loads(open(result_file).read())
    assert data["commit_hash"] == commit
    columns = data["result_columns"]
    values = dict(zip(columns, data["results"]["bench_roundtrips.TreeDepth.time_echo"]))["result"]
    assert any(isinstance(v, float) and v > 0 for v in values)  # measured on the host, not n/a
    assert (results / f"ipb-results-ssh-localhost-{commit[:8]}.tar.gz").exists()
