"""Clusters that outlive one asv process: started once per parameter set.

asv runs each benchmark and parameter combination in a fresh process. The pool
keeps clusters running between them, keyed by (kind, engines, depth), one
JSON record per cluster under ``IPB_BENCH_POOL`` (default ``.asv/pool``).
``stop_all()`` ends them (``run_asv.py`` calls it when the run is over). When
a new cluster would put more real engines up than the profile's
``max_engines``, the least recently used clusters are stopped first.

kinds: ``ours`` (our controller, relay tree of ``depth``, fan-out 2) and
``stock`` (ipyparallel's controller, ``broadcast_scheduler_depth=depth``).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import tempfile
import time

import ipyparallel as ipp
import psutil

import ipyparallel_broadcast as ipb

from .profiles import current

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POOL = os.environ.get("IPB_BENCH_POOL", os.path.join(ROOT, ".asv", "pool"))
KINDS = ("ours", "stock")


def _path(kind, n, depth) -> str:
    return os.path.join(POOL, f"{kind}-n{n}-d{depth}.json")


def _records():
    for path in glob.glob(os.path.join(POOL, "*.json")):
        with open(path) as f:
            yield path, json.load(f)


def _alive(record) -> bool:
    return psutil.pid_exists(record["controller_pid"]) and os.path.exists(record["connection_file"])


def connection_file(kind: str, n: int, depth: int) -> str:
    """The client connection file of a running cluster, started if need be."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    path = _path(kind, n, depth)
    if os.path.exists(path):
        with open(path) as f:
            record = json.load(f)
        if _alive(record):
            record["used"] = time.time()
            _write(path, record)
            return record["connection_file"]
        _stop(path, record)
    _make_room(n)
    return _start(kind, n, depth, path)["connection_file"]


def _start(kind, n, depth, path) -> dict:
    profile_dir = tempfile.mkdtemp(prefix=f"ipb-pool-{kind}-n{n}-d{depth}-")
    common = dict(n=n, profile_dir=profile_dir, log_level=40, shutdown_atexit=False)
    if kind == "ours":
        cluster = ipb.Cluster(depth=depth, fanout=2, **common)
    else:
        cluster = ipp.Cluster(controller_args=[f"--IPController.broadcast_scheduler_depth={depth}"], **common)
    rc = cluster.start_and_connect_sync()
    try:
        rc.wait_for_engines(n, timeout=max(120, n))
    finally:
        rc.close()
    record = dict(
        kind=kind, n=n, depth=depth, profile_dir=profile_dir, cluster_id=cluster.cluster_id,
        controller_pid=cluster.controller.process.pid, used=time.time(),
        connection_file=os.path.join(profile_dir, "security", f"ipcontroller-{cluster.cluster_id}-client.json"),
    )
    _write(path, record)
    return record


def _write(path, record):
    os.makedirs(POOL, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, path)


def _make_room(n):
    records = sorted(_records(), key=lambda pr: pr[1]["used"])
    up = sum(r["n"] for _, r in records)
    while records and up + n > current().max_engines:
        path, record = records.pop(0)
        _stop(path, record)
        up -= record["n"]


def _stop(path, record):
    try:
        cluster = ipp.Cluster.from_file(profile_dir=record["profile_dir"], cluster_id=record["cluster_id"])
        cluster.stop_cluster_sync()
    except Exception:  # already gone: make sure nothing of it is left
        proc = psutil.Process(record["controller_pid"]) if psutil.pid_exists(record["controller_pid"]) else None
        if proc is not None:
            proc.kill()
    shutil.rmtree(record["profile_dir"], ignore_errors=True)
    if os.path.exists(path):
        os.remove(path)


def stop_all():
    for path, record in list(_records()):
        _stop(path, record)
