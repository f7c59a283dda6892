"""A host relay's files (``host.link``, ``relay.hostshell``), with a real relay
process: the last one out removes the host's files, but not those of an
engine that joined while it was leaving (the soak lost such an engine: the
next relay, restarted, did not know it). No engine, controller or leaf is
needed: a relay with no engine exits after its grace period."""

import contextlib
import fcntl
import json
import multiprocessing
import os
import secrets
import subprocess
import sys

import psutil
import pytest
from cluster_util import process_gone, until
from jupyter_client.session import Session

from ipyparallel_broadcast.host import claim as claims
from ipyparallel_broadcast.host.composedir import try_lock
from ipyparallel_broadcast.host.link import HostLink
from ipyparallel_broadcast.host.shm import pid_alive
from ipyparallel_broadcast.wire.naming import TREE_KEY

pytestmark = pytest.mark.cluster  # real relay processes, no controller


@pytest.fixture
def link():
    info = {"interface": "tcp://127.0.0.1", "broadcast": [9], TREE_KEY: {"depth": 0, "fanout": 2}}
    session = Session(key=secrets.token_hex(16).encode())
    link = HostLink.from_connection(info, session, f"test-{secrets.token_hex(4)}", log_level=20)
    link.attach()
    link.spec["grace"] = 1.0  # how long a relay with no engine waits (5 s by default)
    yield link
    for path in (link.place.lock_path, link.place.leaf_path, link.place.log_path, link.place.claim_path):
        if os.path.exists(path):
            os.unlink(path)
    for name in os.listdir(link.place.joins) if os.path.isdir(link.place.joins) else ():
        os.unlink(os.path.join(link.place.joins, name))
    if os.path.isdir(link.place.joins):
        os.rmdir(link.place.joins)


def read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:  # (a relay gone removes its log)
        return b""


def relay_up_then_gone(link, meanwhile=lambda: None):
    """Start the relay; once it is up, ``meanwhile()``; return once it exited."""
    lock = os.open(link.place.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        assert link.ensure_relay()

        def log_says_up():
            return b" up " in read(link.place.log_path)

        until(log_says_up, timeout=30, what="the relay to start")
        meanwhile()

        def unlocked():
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return True

        until(unlocked, timeout=60, what="the relay with no engine to exit")
    finally:
        os.close(lock)


def test_the_last_relay_out_removes_the_hosts_files(link):
    relay_up_then_gone(link)
    place = link.place
    assert not [p for p in (place.lock_path, place.leaf_path, place.log_path, place.joins) if os.path.exists(p)]


def test_an_engine_that_joined_as_the_relay_left_keeps_its_join_file_and_lock(link):
    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    me = dict(eid=7, uuid="a-live-engine", pid=engine.pid, shm=None)
    try:
        relay_up_then_gone(link, meanwhile=lambda: link._write_join_file(me))
        place = link.place
        with open(os.path.join(place.joins, me["uuid"])) as f:
            assert json.load(f) == me  # the next relay, and any restarted after it, find the engine
        assert os.path.exists(place.lock_path)  # the engines' watchers wait on this one
    finally:
        engine.kill()
        engine.wait()


def test_a_relay_waits_past_its_grace_for_engines_that_claim_the_host(link):
    """An engine claims the host before it starts the relay and registers
    (``host.claim``): on a loaded host its first request can come after the
    grace, and a relay gone by then left its engines waiting for ever."""
    link.claim()

    def waits_then_release():
        until(lambda: b"engines claim the host; waiting" in read(link.place.log_path), timeout=60)
        fd = os.open(link.place.lock_path, os.O_RDWR)
        try:
            assert not try_lock(fd)  # the relay is still there, past its grace
        finally:
            os.close(fd)
        link.release()

    try:
        relay_up_then_gone(link, meanwhile=waits_then_release)
    finally:
        link.release()


def test_a_claim_waits_for_a_leaving_relay_and_then_holds_the_next_lock_file(tmp_path):
    path = str(tmp_path / "claim")
    held = claims.claim(path, timeout=1)
    assert claims.leave(path) is None  # an engine on its way: the relay stays
    claims.release(held)
    leaving = claims.leave(path)
    assert leaving is not None
    with pytest.raises(TimeoutError, match="did not leave"):
        claims.claim(path, timeout=0.2)  # held by the leaving relay: no claim
    os.unlink(path)  # the relay's clean-up; the engine claims the next file, not the old one
    fd = claims.claim(path, timeout=1)
    assert os.fstat(fd).st_ino == os.stat(path).st_ino
    assert claims.leave(path) is None
    claims.release(fd)
    os.close(leaving)


def _start_relay_niced(link, nice: int):
    os.nice(nice)
    link.ensure_relay()


@pytest.mark.skipif(not os.path.exists("/proc/self/autogroup"), reason="the kernel groups no sessions (no autogroup)")
def test_a_relay_started_under_nice_runs_its_session_at_that_nice(link):
    """A relay's session is its own scheduling group (autogroup): at the
    default weight, 64 relays of niced engines took the controller's share."""
    child = multiprocessing.get_context("fork").Process(target=_start_relay_niced, args=(link, 7))
    child.start()
    child.join(30)
    assert child.exitcode == 0

    found = []

    def the_relay_runs():
        for p in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error):
                if "ipyparallel_broadcast.relay.hostshell" in (p.info["cmdline"] or []) and p.nice() == 7:
                    found.append(p.pid)
        return found

    until(the_relay_runs, timeout=30, what="the niced relay")
    until(lambda: b" up " in read(link.place.log_path), timeout=60, what="the relay to start")
    with open(f"/proc/{found[0]}/autogroup") as f:
        assert f.read().split()[-2:] == ["nice", "7"]
    until(lambda: process_gone(found[0]), timeout=60, what="the relay with no engine to leave")


def test_a_zombie_is_not_alive():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    until(lambda: not pid_alive(child.pid), timeout=30, what="the exited child to count as gone")
    assert child.poll() is not None  # reaped only now: it was a zombie while not alive
    assert pid_alive(os.getpid()) and not pid_alive(None) and not pid_alive("junk")
