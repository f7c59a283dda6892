"""SimEngines against a real controller: simulated engines register with
the hub (behind a simulated host: through its relay, by host), are reached
by DirectView and through the relay tree, and one can be killed on demand
(the hub notices its silence; the others still answer)."""

import contextlib
import glob
import os
import tempfile
import time

import ipyparallel as ipp
import psutil
import pytest
from cluster_util import quiet_config, until

import ipyparallel_broadcast as ipb
from ipyparallel_broadcast.tools.sim import SimEngines

pytestmark = pytest.mark.cluster

N = 48


@contextlib.contextmanager
def simulated_farm(n: int):
    """A controller and ``n`` simulated engines in two processes; yields ``(sim, rc)``."""
    with tempfile.TemporaryDirectory(prefix="ipb-sim-") as profile_dir:
        cluster = ipb.Cluster(n=0, depth=2, fanout=2, profile_dir=profile_dir, config=quiet_config(), log_level=40)
        cluster.start_controller_sync()
        rc = cluster.connect_client_sync()  # once the connection files are written
        (engine_file,) = glob.glob(os.path.join(profile_dir, "security", "*-engine.json"))
        sim = SimEngines(engine_file, n, per_process=n // 2, reply_bytes=1000)
        try:
            sim.start(timeout=120)
            rc.wait_for_engines(n, timeout=120)
            yield sim, rc
            rc.close()
        finally:
            sim.stop()
            cluster.stop_cluster_sync()


@pytest.fixture(scope="module")
def farm():
    """N simulated engines, all of them there for every test that takes it (a test
    that kills one makes a farm of its own)."""
    with simulated_farm(N) as (sim, rc):
        yield sim, rc


def test_simulated_engines_register_and_answer_every_view(farm):
    sim, rc = farm
    assert sorted(rc.ids) == sim.ids and len(sim.ids) == N
    for coalescing in (True, False, ipb.Batch(8)):
        assert rc.broadcast_view(coalescing=coalescing).apply_sync(lambda: 1) == [b"\0" * 1000] * N
    assert rc[:].apply_sync(lambda: 1) == [b"\0" * 1000] * N
    rc.broadcast_view().execute("x = 1", block=True)
    assert rc.broadcast_view().reduce(lambda: 2, op="sum", block=True) == N  # each answers a reduce with 1
    stats = rc.broadcast_stats()
    assert sum(n["engines"] for n in stats if n["engines"] is not None) == N
    assert all(n["busy"] > 0 and n["cpu"] > 0 for n in stats)  # where the time goes


def test_streamed_replies_are_kept_when_the_client_falls_behind(farm):
    """~19 MB of streamed replies pile up while the client stops reading: every
    relay node's sockets queue them (none has the default high-water mark of
    1,000 messages, past which a ROUTER drops silently) and all arrive."""
    sim, rc = farm
    view = rc.broadcast_view(coalescing=False)
    ars = [view.apply_async(lambda: 1) for _ in range(200)]
    rc._io_loop.add_callback(time.sleep, 5)  # after sending them, the client's I/O thread naps
    for ar in ars:
        assert ar.get(timeout=120) == [b"\0" * 1000] * N
    assert all(n["pending"] == 0 for n in rc.broadcast_stats())


def test_one_simulated_engine_killed_on_demand():
    n = 8
    with simulated_farm(n) as (sim, rc):
        victim = sim.ids[5]
        sim.kill(victim)
        until(lambda: victim not in rc.ids, what="the hub to notice the silent engine")
        view = rc.broadcast_view()
        assert len(view.apply_sync(lambda: 1)) == n - 1
        assert victim not in sim.ids


def test_simulated_hosts_each_run_a_host_relay():
    """``hosts=True``: each simulated process is a host with its own relay, on
    the same path as real engines on another host."""
    with tempfile.TemporaryDirectory(prefix="ipb-sim-") as profile_dir:
        cluster = ipb.Cluster(n=0, depth=1, fanout=2, profile_dir=profile_dir, config=quiet_config(), log_level=40)
        cluster.start_controller_sync()
        rc = cluster.connect_client_sync()
        (engine_file,) = glob.glob(os.path.join(profile_dir, "security", "*-engine.json"))
        (client_file,) = glob.glob(os.path.join(profile_dir, "security", "*-client.json"))
        stock = ipp.Client(client_file)  # ipyparallel's: told each engine, not a host's batch
        sim = SimEngines(engine_file, 12, per_process=4, reply_bytes=10, hosts=True)
        try:
            sim.start(timeout=120)
            rc.wait_for_engines(12, timeout=120)
            stock.wait_for_engines(12, timeout=120)
            assert stock.ids == rc.ids
            stock.close()
            for coalescing in (True, False):
                assert rc.broadcast_view(coalescing=coalescing).apply_sync(lambda: 1) == [b"\0" * 10] * 12
            relays = [n for n in rc.broadcast_stats() if n.get("host")]
            assert len(relays) == 3 and sorted(e for n in relays for e in n["eids"]) == rc.ids
            assert sorted(len(n["eids"]) for n in relays) == [4, 4, 4]
            # each registered its 4 engines with the hub and watches their hearts (by host)
            assert [(n["registered_here"], n["hearts"]) for n in relays] == [(4, 4)] * 3
            rc.close()
        finally:
            sim.stop()
            cluster.stop_cluster_sync()
        # the last engine out stops its relay, though nobody is left to tell it
        until(
            lambda: not any(psutil.pid_exists(n["pid"]) for n in relays),
            timeout=60,
            what="the host relays to exit once their engines are gone",
        )


def silence_one_then_kill_a_process(rc, sim):
    """An engine of the first process falls silent and is unregistered; then the
    second process is killed (its hosts, relays and all), and its engines go."""
    victim = sim.processes[0][2][0]
    sim.kill(victim)
    until(lambda: victim not in rc.ids, timeout=60, what="the silent engine to be unregistered")
    lost = sim.kill_process(1)
    until(lambda: not set(lost) & set(rc.ids), timeout=60, what="the killed process's engines to go")


@contextlib.contextmanager
def six_hosts(**farm):
    """A controller (depth 0, ``host_fanout`` 2) and 12 simulated engines on six
    hosts, three to each of two farm processes, not on the mux; yields ``(sim, rc)``."""
    with tempfile.TemporaryDirectory(prefix="ipb-sim-") as profile_dir:
        cluster = ipb.Cluster(
            n=0,
            depth=0,
            fanout=2,
            profile_dir=profile_dir,
            config=quiet_config(),
            log_level=40,
            controller_args=["--BroadcastController.host_fanout=2"],
        )
        cluster.start_controller_sync()
        rc = cluster.connect_client_sync()
        (engine_file,) = glob.glob(os.path.join(profile_dir, "security", "*-engine.json"))
        shape = dict(per_process=6, reply_bytes=10, hosts=True, hosts_per_process=3, mux=False)
        sim = SimEngines(engine_file, 12, **shape, **farm)
        try:
            sim.start(timeout=120)
            rc.wait_for_engines(12, timeout=120)
            yield sim, rc
            rc.close()
        finally:
            sim.stop()
            cluster.stop_cluster_sync()


def test_many_simulated_hosts_in_one_process_run_the_real_relays_on_one_loop():
    """``hosts_per_process``: each farm process is three hosts and runs their
    three relays itself (``relay.loop``), engines spread over them and, without
    the mux, reached through the tree alone. A silent engine is given up by
    its in-process relay; a process killed takes its three hosts with it.
    With ``host_fanout=2`` a leaf sends a call to two of the six host relays,
    which pass it on (``relay.forwarding``) over their real chunk sockets."""
    with six_hosts() as (sim, rc):
        for coalescing in (True, False):
            assert rc.broadcast_view(coalescing=coalescing).apply_sync(lambda: 1) == [b"\0" * 10] * 12
        stats = rc.broadcast_stats()
        assert [n["calls_split"] for n in stats if not n.get("host")] == [2]  # (the root is the leaf)
        relays = [n for n in stats if n.get("host")]
        assert sum(n["calls_passed"] for n in relays) == 2 * 2  # each call passed on by its two heads
        assert sorted(e for n in relays for e in n["eids"]) == rc.ids
        assert [(len(n["eids"]), n["registered_here"], n["hearts"]) for n in relays] == [(2, 2, 2)] * 6
        farm_pids = {proc.pid for proc, _, _ in sim.processes}
        assert {n["pid"] for n in relays} == farm_pids  # the relays run in the farm's two processes
        silence_one_then_kill_a_process(rc, sim)
        assert rc.ids == sim.ids and len(rc.ids) == 5
        assert rc.broadcast_view(coalescing=False).apply_sync(lambda: 1) == [b"\0" * 10] * 5


def test_an_output_reaches_its_call_after_the_client_forgot_its_engine():
    """A simulated engine's output names no engine in its metadata (its IOPub
    topic does). An engine that dies right after it answers may be forgotten
    by the client (its unregistration handled first) before its output is
    read: the output must still reach the call, not be dropped while the idle
    status ends it with an empty stdout (the chaos soak found 180)."""
    with tempfile.TemporaryDirectory(prefix="ipb-sim-") as profile_dir:
        cluster = ipb.Cluster(n=0, depth=1, fanout=2, profile_dir=profile_dir, config=quiet_config(), log_level=40)
        cluster.start_controller_sync()
        rc = cluster.connect_client_sync()
        (engine_file,) = glob.glob(os.path.join(profile_dir, "security", "*-engine.json"))
        sim = SimEngines(engine_file, 2, per_process=2, delay=0.5)  # answers come 0.5 s after the request
        try:
            sim.start(timeout=120)
            rc.wait_for_engines(2, timeout=120)
            eid = rc.ids[0]
            for coalescing in (True, False):
                ar = rc.broadcast_view([eid], coalescing=coalescing).execute("print('routed')", block=False)
                uuid = rc._engines.pop(eid)  # the client forgets the engine before its output comes
                try:
                    assert ar.wait_for_output(30)
                    assert "routed" in ar.stdout[0], (coalescing, ar.stdout, ar.stderr)
                finally:
                    rc._engines[eid] = uuid
            rc.close()
        finally:
            sim.stop()
            cluster.stop_cluster_sync()


def test_behind_simulated_hosts_a_silent_engine_and_a_killed_host_are_unregistered():
    """Heartbeats by host: a simulated engine that falls silent is given up
    by its relay (it cannot see the engine's process: silence is death), and
    a host killed whole (relay and engines) takes its engines with it."""
    with tempfile.TemporaryDirectory(prefix="ipb-sim-") as profile_dir:
        cluster = ipb.Cluster(n=0, depth=1, fanout=2, profile_dir=profile_dir, config=quiet_config(), log_level=40)
        cluster.start_controller_sync()
        rc = cluster.connect_client_sync()
        (engine_file,) = glob.glob(os.path.join(profile_dir, "security", "*-engine.json"))
        sim = SimEngines(engine_file, 8, per_process=4, hosts=True)
        try:
            sim.start(timeout=120)
            rc.wait_for_engines(8, timeout=120)
            silence_one_then_kill_a_process(rc, sim)
            assert rc.ids == sim.ids and len(rc.ids) == 3
            assert rc.broadcast_view().apply_sync(lambda: 1) == [b""] * 3
            rc.close()
        finally:
            sim.stop()
            cluster.stop_cluster_sync()


def test_relays_that_simulate_their_engines_serve_every_view():
    """``in_relay``: each host's relay simulates its engines itself (``tools.simhost``),
    with no engine socket: they register, beat and answer through the relay's own
    code, as if read from its sockets. Every view is answered; an execute's output
    reaches the client; a silent engine is given up by its relay; a process killed
    takes its hosts with it."""
    with six_hosts(in_relay=True) as (sim, rc):
        for coalescing in (True, False, ipb.Batch(4)):
            assert rc.broadcast_view(coalescing=coalescing).apply_sync(lambda: 1) == [b"\0" * 10] * 12
        assert rc.broadcast_view().reduce(lambda: 2, op="sum", block=True) == 12
        ar = rc.broadcast_view(coalescing=False).execute("print(engine_id)", block=True)
        assert sorted(int(out) for out in ar.stdout) == rc.ids
        stats = rc.broadcast_stats()
        relays = [n for n in stats if n.get("host")]
        assert sorted(e for n in relays for e in n["eids"]) == rc.ids
        assert [(len(n["eids"]), n["registered_here"], n["hearts"]) for n in relays] == [(2, 2, 2)] * 6
        assert {n["pid"] for n in relays} == {proc.pid for proc, _, _ in sim.processes}
        silence_one_then_kill_a_process(rc, sim)
        assert rc.ids == sim.ids and len(rc.ids) == 5
        assert rc.broadcast_view(coalescing=False).apply_sync(lambda: 1) == [b"\0" * 10] * 5
