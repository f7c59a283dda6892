"""Registration and heartbeats by host, with real engines behind a host
relay on this machine (``host_relay='always'``): the engines register and
beat through their relay; an engine stopped (SIGSTOP) for longer than the
hub would have waited for its heart is kept, and answers once resumed; an
engine killed with its nanny (nobody tells the hub) is unregistered, and its
peers are served. (Across hosts, on the multi-host bed: test_multihost.)"""

import os
import signal

import psutil
import pytest
from cluster_util import quiet_config, running_cluster, until

pytestmark = pytest.mark.cluster

N = 3
PORTS = "47100-47199"  # the relay's port for other hosts' chunks comes from here


def relayed_cluster():
    config = quiet_config()
    config.BroadcastEngine.host_relay = "always"
    config.BroadcastEngine.host_relay_ports = PORTS
    return running_cluster(N, 1, 2, config=config)


@pytest.fixture(scope="class")
def rc():
    """A cluster whose engines all live: the tests that kill engines have their own
    (class scope: one cluster at a time, each gone before the other class starts)."""
    with relayed_cluster() as rc:
        yield rc


@pytest.fixture(scope="class")
def doomed():
    """The cluster of the tests that kill engines (each starts what the one before killed)."""
    with relayed_cluster() as rc:
        yield rc


def relay(rc) -> dict:
    (stats,) = [n for n in rc.broadcast_stats() if n.get("host")]
    return stats


def engine_pid(rc, eid) -> int:
    return rc[eid].apply_sync(os.getpid)


def test_a_port_range_is_low_high():
    from ipyparallel_broadcast.host.link import port_range

    assert port_range("") is None and port_range("5000-5000") == (5000, 5000) and port_range("1-65535") == (1, 65535)
    for bad in ("5000", "5001-5000", "0-10", "10-70000", "a-b", "-"):
        with pytest.raises(ValueError, match="low-high"):
            port_range(bad)


def kill_engine(rc, eid, relay_too=False):
    """SIGKILL an engine and its nanny (nobody tells the hub); ``relay_too``:
    and its host's relay (an engine's child if that engine started it)."""
    proc = psutil.Process(engine_pid(rc, eid))
    relay_pid = relay(rc)["pid"]
    victims = [p for p in proc.children(recursive=True) if p.pid != relay_pid] + [proc]
    if relay_too:
        victims.append(psutil.Process(relay_pid))
    for p in victims:
        p.kill()


class TestLiveEngines:
    """Engines that all live: registration, heartbeats, a pause."""

    def test_engines_register_and_beat_through_their_relay(self, rc):
        stats = relay(rc)
        assert stats["registered_here"] == N and stats["hearts"] == N and sorted(stats["eids"]) == rc.ids

    def test_the_relay_listens_for_other_hosts_chunks_on_a_port_of_its_range(self, rc):
        listening = [
            c.laddr.port for c in psutil.Process(relay(rc)["pid"]).net_connections("tcp") if c.status == "LISTEN"
        ]
        assert len(listening) == 1 and 47100 <= listening[0] <= 47199, listening

    def test_an_engine_paused_past_the_hubs_bound_is_kept_and_answers_when_resumed(self, rc):
        ids = list(rc.ids)
        pid = engine_pid(rc, ids[0])
        os.kill(pid, signal.SIGSTOP)
        try:
            until(lambda: relay(rc)["paused"] == 1, timeout=60, what="the relay to see the engine paused")
            pings = relay(rc)["pings"]
            # the hub's own heart monitor gives an engine up after 3 missed pings
            until(lambda: relay(rc)["pings"] >= pings + 6, timeout=60, what="six more pings while it is paused")
            assert rc.ids == ids and relay(rc)["paused"] == 1
        finally:
            os.kill(pid, signal.SIGCONT)
        assert rc.broadcast_view().apply_sync(lambda: 1) == [1] * N
        until(lambda: relay(rc)["paused"] == 0, timeout=60, what="the engine's heart to answer again")


class TestKilledEngines:
    """Engines killed with their nanny, and with their relay."""

    @pytest.mark.parametrize("relay_too", [False, True], ids=["engine", "engine-and-relay"])
    def test_an_engine_killed_with_its_nanny_is_unregistered_and_its_peers_served(self, doomed, relay_too):
        """Killed alone, the relay sees it die; killed with the relay, the
        relay started next finds that it died (its join file, a dead pid)."""
        rc = doomed
        if len(rc.ids) < N:
            rc.cluster.start_engines_sync(N - len(rc.ids))
            rc.wait_for_engines(N, timeout=60)
        victim = rc.ids[-1]
        kill_engine(rc, victim, relay_too)
        until(lambda: victim not in rc.ids, timeout=60, what="the hub to unregister the killed engine")
        until(lambda: relay(rc)["engines"] == N - 1, timeout=60, what="the (restarted) relay to serve the others")
        assert rc.broadcast_view().apply_sync(lambda: 1) == [1] * (N - 1)
