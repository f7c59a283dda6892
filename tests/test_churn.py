"""Engines that come and go on a real cluster: late engines are reachable
through the tree, and new engines refill the leaf that lost engines (the
policy: ``topology.balanced_id``)."""

import os
import signal

import pytest
from cluster_util import running_cluster, settled_stats, until

pytestmark = pytest.mark.cluster


def leaf_loads(rc):
    return {n["node"]: n["engines"] for n in rc.broadcast_stats() if n["engines"] is not None}


def wait_for_ids(rc, predicate):
    until(lambda: predicate(rc.ids), what="the engines to register or unregister")


def test_late_engines_are_reachable_and_refill_the_emptied_leaf():
    with running_cluster(2, 1, 2) as rc:
        rc.cluster.start_engines_sync(2)  # registering after the tree started
        wait_for_ids(rc, lambda ids: len(ids) == 4)
        assert rc.ids == [0, 1, 2, 3]
        view = rc.broadcast_view()
        pids = view.apply_sync(os.getpid)
        assert len(set(pids)) == 4
        for eid in (0, 2):  # both on leaf 0
            os.kill(pids[eid], signal.SIGKILL)
        wait_for_ids(rc, lambda ids: ids == [1, 3])
        assert leaf_loads(rc) == {"0": 0, "1": 2}
        status = rc.queue_status()
        assert sorted(k for k in status if k != "unassigned") == [1, 3]  # dead ones gone
        rc.cluster.start_engines_sync(2)
        wait_for_ids(rc, lambda ids: len(ids) == 4)
        assert rc.ids == [1, 3, 4, 6]  # numbered onto leaf 0, the emptied one
        assert leaf_loads(rc) == {"0": 2, "1": 2}
        assert len(set(rc.broadcast_view().apply_sync(os.getpid))) == 4
        assert rc.broadcast_view([4, 6]).apply_sync(lambda: 1) == [1, 1]
        assert all(n["pending"] == 0 for n in settled_stats(rc))
