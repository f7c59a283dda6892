"""Real local clusters for integration tests (real processes, real sockets)."""

import contextlib
import os
import tempfile
import time

from traitlets.config import Config

import ipyparallel_broadcast as ipb


def quiet_config():
    config = Config()
    # fast heartbeats: small clusters here notice dead engines quickly
    config.HeartMonitor.period = 250
    return config


@contextlib.contextmanager
def running_cluster(n, depth, fanout, config=None, **kwargs):
    """Start a broadcast cluster of n engines; yield a connected ipb.Client.
    ``config``: the cluster's config (default: ``quiet_config()``)."""
    with tempfile.TemporaryDirectory(prefix="ipb-test-", dir=os.environ.get("IPB_TEST_DIR")) as profile_dir:
        cluster = ipb.Cluster(
            n=n,
            depth=depth,
            fanout=fanout,
            profile_dir=profile_dir,
            config=quiet_config() if config is None else config,
            log_level=int(os.environ.get("IPB_TEST_LOG_LEVEL", 40)),
            **kwargs,
        )
        rc = cluster.start_and_connect_sync()
        rc.test_profile_dir = profile_dir  # tests find connection files here
        try:
            rc.wait_for_engines(n, timeout=60)
            yield rc
        finally:
            rc.close()
            cluster.stop_cluster_sync()
            os.environ.pop("IPP_CLUSTER_ID", None)


def settled_stats(rc, timeout=10):
    """Every node's stats once none has a request pending (or at the timeout).

    A client can learn of a dead engine from the hub, and finish, a moment
    before the leaf hears of it and releases the request: state must be gone
    soon after, not necessarily at that instant. A leak still fails.
    """
    deadline = time.monotonic() + timeout
    while True:
        nodes = rc.broadcast_stats()
        if all(n.get("pending") == 0 for n in nodes) or time.monotonic() > deadline:
            return nodes
        time.sleep(0.05)


def until(predicate, timeout=60, what="a condition"):
    """Wait (polling) until ``predicate()`` is true; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def at_gate(path):
    """Engine side: hold until the file ``path`` exists; return the pid."""
    import os
    import time

    while not os.path.exists(path):
        time.sleep(0.02)
    return os.getpid()
