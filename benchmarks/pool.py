"""Clusters that outlive one asv process: started once per parameter set.

asv runs each benchmark and parameter combination in a fresh process. The pool
keeps clusters running between them, keyed by (kind, engines, depth), one
JSON record per cluster under ``IPB_BENCH_POOL`` (default ``.asv/pool``).
``stop_all()`` ends them (``run_asv.py`` calls it when the run is over). When
a new cluster would put more real engines up than the profile's
``max_engines``, the least recently used clusters are stopped first.

kinds:
- ``ours``: our controller, relay tree of ``depth`` and ``fanout``;
- ``stock``: ipyparallel's controller, ``broadcast_scheduler_depth=depth``;
- ``ours-sim``, ``stock-sim``: the same controllers with ``n`` simulated
  engines (``python -m ipyparallel_broadcast.tools.sim``, a detached process);
- ``ours-simhosts``: ours, its simulated engines run as ``SIM_HOSTS`` hosts,
  each behind its own host relay;
- ``dask``: a local Dask cluster of ``n`` workers
  (``python -m ipyparallel_broadcast.tools.peers dask-serve``); its
  "connection file" holds the scheduler's address.
Simulated engines do not count against ``max_engines``.
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

import ipyparallel as ipp
import psutil

import ipyparallel_broadcast as ipb
from ipyparallel_broadcast.launch.keepsettings import main_process

from .profiles import current

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POOL = os.environ.get("IPB_BENCH_POOL", os.path.join(ROOT, ".asv", "pool"))
KINDS = ("ours", "ours-default", "stock", "ours-sim", "ours-simhosts", "stock-sim", "dask")
SIM_HOSTS = 16  # ours-simhosts: the simulated engines run as this many hosts, each with its host relay


def _path(kind, n, depth, fanout) -> str:
    return os.path.join(POOL, f"{kind}-n{n}-d{depth}-f{fanout}.json")


def _real(kind, n) -> int:
    """Engines of this kind that cost a real process each."""
    return 0 if "-sim" in kind else n


def _records():
    for path in glob.glob(os.path.join(POOL, "*.json")):
        with open(path) as f:
            yield path, json.load(f)


def _alive(record) -> bool:
    pids = [record["controller_pid"], *record.get("helper_pids", [])]
    return all(psutil.pid_exists(p) for p in pids) and os.path.exists(record["connection_file"])


def connection_file(kind: str, n: int, depth: int = 1, fanout: int = 2) -> str:
    """The client connection file of a running cluster, started if need be."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    path = _path(kind, n, depth, fanout)
    if os.path.exists(path):
        with open(path) as f:
            record = json.load(f)
        if _alive(record):
            record["used"] = time.time()
            _write(path, record)
            return record["connection_file"]
        _stop(path, record)
    _make_room(_real(kind, n))
    return _start(kind, n, depth, fanout, path)["connection_file"]


def controller_pid(kind: str, n: int, depth: int = 1, fanout: int = 2) -> int:
    """The controller process of a running pool cluster (``connection_file`` first)."""
    with open(_path(kind, n, depth, fanout)) as f:
        return json.load(f)["controller_pid"]


def _detached(*args) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", *args], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def _start(kind, n, depth, fanout, path) -> dict:
    profile_dir = tempfile.mkdtemp(prefix=f"ipb-pool-{kind}-n{n}-d{depth}-f{fanout}-")
    record = dict(kind=kind, n=n, depth=depth, fanout=fanout, profile_dir=profile_dir, used=time.time())
    if kind == "dask":
        address = os.path.join(profile_dir, "scheduler-address")
        proc = _detached(
            "ipyparallel_broadcast.tools.peers", "dask-serve", "--engines", str(n), "--address-file", address
        )
        _until(lambda: os.path.exists(address), timeout=max(120, n), what=f"{n} Dask workers")
        record.update(controller_pid=proc.pid, connection_file=address)
        _write(path, record)
        return record
    sim = "-sim" in kind
    common = dict(n=0 if sim else n, profile_dir=profile_dir, log_level=40, shutdown_atexit=False)
    if kind.startswith("ours"):  # ours-default: engines without thread limits (compose suite)
        compose = "default" if kind == "ours-default" else None
        cluster = ipb.Cluster(depth=depth, fanout=fanout, compose=compose, **common)
    else:
        cluster = ipp.Cluster(controller_args=[f"--IPController.broadcast_scheduler_depth={depth}"], **common)
    if sim:  # lenient heartbeats (ipyparallel's defaults): thousands of engines share few cores
        cluster.controller_args = list(cluster.controller_args) + [
            "--HeartMonitor.period=3000",
            "--HeartMonitor.max_heartmonitor_misses=10",
        ]
    rc = cluster.start_and_connect_sync()
    record.update(
        cluster_id=cluster.cluster_id,
        controller_pid=main_process(cluster.controller.process.pid).pid,
        connection_file=os.path.join(profile_dir, "security", f"ipcontroller-{cluster.cluster_id}-client.json"),
    )
    try:
        if sim:
            engine_file = record["connection_file"].replace("-client.json", "-engine.json")
            hosts = ["--hosts", "--per-process", str(max(1, -(-n // SIM_HOSTS)))] if kind == "ours-simhosts" else []
            record["helper_pids"] = [
                _detached("ipyparallel_broadcast.tools.sim", engine_file, "--engines", str(n), *hosts).pid
            ]
            _write(path, record)  # from here on, stop() can find the farm
        rc.wait_for_engines(n, timeout=max(120, n / 10))
    finally:
        rc.close()
    _write(path, record)
    return record


def _until(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _write(path, record):
    os.makedirs(POOL, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, path)


def _make_room(n):
    records = sorted(_records(), key=lambda pr: pr[1]["used"])
    up = sum(_real(r["kind"], r["n"]) for _, r in records)
    while records and up + n > current().max_engines:
        path, record = records.pop(0)
        _stop(path, record)
        up -= _real(record["kind"], record["n"])


def _end(pid: int, sig=signal.SIGTERM, wait: float = 10):
    try:
        proc = psutil.Process(pid)
        proc.send_signal(sig)
        proc.wait(wait)
    except psutil.TimeoutExpired:
        proc.kill()
    except psutil.Error:
        pass


def _stop(path, record):
    for pid in record.get("helper_pids", []):
        _end(pid)
    if record["kind"] == "dask":
        _end(record["controller_pid"])
    else:
        try:
            cluster = ipp.Cluster.from_file(profile_dir=record["profile_dir"], cluster_id=record["cluster_id"])
            cluster.stop_cluster_sync()
        except Exception:  # already gone: make sure nothing of it is left
            _end(record["controller_pid"], signal.SIGKILL)
    shutil.rmtree(record["profile_dir"], ignore_errors=True)
    if os.path.exists(path):
        os.remove(path)


def stop_all():
    for path, record in list(_records()):
        _stop(path, record)
