"""A real Slurm across the multi-host bed (issue 46): ``munged`` and
``slurmctld`` on the controller host, a ``slurmd`` on each of 3 engine hosts,
and ``ipcluster start`` / ``ipcluster stop`` as users run them there.

Needs root and Debian's ``slurm-wlm`` and ``munge``: without them these tests
skip and say why; under ``CI=true`` they fail.
"""

import glob
import os
import signal

import ipyparallel as ipp
import numpy as np
import psutil
import pytest
from cluster_util import every_operation, process_gone, skip_or_fail, until
from ipyparallel import error

import ipyparallel_broadcast as ipb
from ipyparallel_broadcast.tools.bedcluster import IPCluster
from ipyparallel_broadcast.tools.netbed import NetBed
from ipyparallel_broadcast.tools.slurmbed import SlurmBed

pytestmark = pytest.mark.multihost

PER_NODE, NODES = 4, 3
N = PER_NODE * NODES
MODES = [True, False, ipb.Batch(2)]
MODE_IDS = ["coalescing", "streaming", "batch2"]


@pytest.fixture(scope="module")
def slurm():
    why = SlurmBed.available()
    if why:
        skip_or_fail(why, "the Slurm tests")
    with NetBed(hosts=NODES) as bed, SlurmBed(bed, cpus=PER_NODE + 1) as slurm:  # +1: a controller job
        for host in bed.hosts:
            bed.limit(host, "1gbit")
        yield slurm


def client(cluster, n=N):
    rc = ipb.Client(cluster.connection_file())
    rc.wait_for_engines(n, timeout=120)
    return rc


# ------------------------------------------------- engines by sbatch, controller local
# the deployment guide's engines-per-node batch template, as it is there
TEMPLATE = os.path.join(os.path.dirname(__file__), "..", "docs", "guide", "slurm_engines.sbatch")
ENGINES_BY_SLURM = """
c.Cluster.controller_launcher_class = "broadcast"
c.Cluster.engine_launcher_class = "broadcast-slurm"
c.Cluster.controller_ip = "{addr}"
c.BroadcastSlurmEngineSetLauncher.batch_template_file = {template!r}
c.BroadcastController.depth = 1
c.BroadcastEngine.compose = "static"
"""


@pytest.fixture(scope="class")
def slurm_engines(slurm):
    shm_before = set(os.listdir("/dev/shm"))
    config = ENGINES_BY_SLURM.format(addr=slurm.bed.controller.addr, template=os.path.abspath(TEMPLATE))
    cluster = IPCluster(slurm, config).start(N)
    cluster.rc = client(cluster)
    cluster.shm_before = shm_before
    yield cluster
    # ipcluster stop, once the class is done with the cluster (class scope: its tests
    # run together whatever the order, and the cluster is gone before the next Slurm test)
    cluster.rc.close()
    out = cluster.stop()
    assert "Stopping engine(s)" in out
    assert not glob.glob(os.path.join(cluster.security, "cluster-*.json"))
    assert cluster.left_behind(shm_before) == {}, "ipcluster stop left a job, a process or a shm name behind"


class TestEnginesBySbatch:
    """Engines started by sbatch from the docs' template, the controller local."""

    @pytest.mark.parametrize("coalescing", MODES, ids=MODE_IDS)
    def test_every_operation_on_engines_started_by_sbatch(self, slurm_engines, coalescing):
        every_operation(slurm_engines.rc, coalescing)

    def test_engines_from_sbatch_sit_behind_their_hosts_relays_with_slurm_budgets(self, slurm_engines):
        rc = slurm_engines.rc
        relays = {n["host"]: sorted(n["eids"]) for n in rc.broadcast_stats() if n.get("host")}
        assert len(relays) == NODES and all(len(eids) == PER_NODE for eids in relays.values()), relays
        from ipyparallel_broadcast.engine.compose import status

        @ipp.interactive
        def where():
            import os

            from ipyparallel_broadcast.host.link import host_label

            return host_label(), os.environ["SLURM_LOCALID"], os.environ["SLURM_STEP_TASKS_PER_NODE"]

        places = rc.broadcast_view().apply_sync(where)
        by_host = {}
        for label, local_id, _ in places:
            by_host.setdefault(label, set()).add(local_id)
        assert sorted(by_host.values(), key=sorted) == [{"0", "1", "2", "3"}] * NODES
        statuses = rc.broadcast_view().apply_sync(status)
        # srun's local rank and tasks per node set each budget from the first request:
        # 4 engines on a node of 2 usable cores get 1 thread each (2/1/1/1 before)
        assert [s["launcher_engines"] for s in statuses] == [PER_NODE] * N
        assert [s["budget"] for s in statuses] == [max(1, s["cores"] // PER_NODE) for s in statuses]

    def test_a_big_push_crosses_each_slurm_hosts_link_once(self, slurm_engines):
        rc, bed = slurm_engines.rc, slurm_engines.bed
        data = np.ones(16 * 2**20, dtype=np.uint8)
        before = [bed.link_bytes(h)[0] for h in bed.hosts]
        rc.broadcast_view().push(dict(big=data), block=True)
        received = [bed.link_bytes(h)[0] - b for h, b in zip(bed.hosts, before)]
        assert all(data.nbytes <= r < 1.1 * data.nbytes for r in received), received
        assert rc.broadcast_view().apply_sync(ipp.interactive(lambda: int(big.sum()))) == [data.size] * N  # noqa: F821


# ---------------------------------------------------- the controller as a Slurm job too
BOTH_BY_SLURM = """
c.Cluster.controller_launcher_class = "broadcast-slurm"
c.Cluster.engine_launcher_class = "broadcast-slurm"
c.Cluster.controller_ip = "*"
c.BroadcastSlurmEngineSetLauncher.engines_per_node = {per_node}
c.BroadcastController.depth = "auto"
c.BroadcastController.fanout = "auto"
"""
# an interpreter without this package, as the docs' old "python3 -m ..." found in a job
BROKEN = """
c.BroadcastSlurmControllerLauncher.controller_cmd = ["/usr/bin/python3", "-m", "ipyparallel_broadcast.controller"]
c.BroadcastSlurmControllerLauncher.connection_info_timeout = 600
"""


def hub_process(bed):
    """The controller's main process, wherever its job runs: its keeper's child."""
    found = []
    for host in bed.hosts:
        for pid in bed.pids(host):
            try:
                process = psutil.Process(pid)
                if "ipyparallel_broadcast.launch.keeper" in process.cmdline():
                    found += [child.pid for child in process.children()]
            except psutil.NoSuchProcess:
                continue
    (pid,) = found
    return pid


def kill_the_hub_and_find_the_cluster_kept(rc, bed):
    """SIGKILL the controller inside its job: its keeper starts it again
    (``--restore``), and the same client finds the same engines and state."""
    ids = list(rc.ids)
    view = rc.broadcast_view()
    view.push(dict(kept="state"), block=True)
    pids = view.apply_sync(os.getpid)
    hub = hub_process(bed)
    os.kill(hub, signal.SIGKILL)
    until(lambda: process_gone(hub), what="the controller gone")
    until(lambda: hub_process_other_than(bed, hub), timeout=60, what="the controller restarted in its job")

    def answers():
        try:
            return view.apply_async(os.getpid).get(timeout=10) == pids
        except (error.CompositeError, error.RemoteError, TimeoutError):
            return False

    until(answers, timeout=60, what="a broadcast answered by the same engines")
    assert rc.ids == ids and view.pull("kept", block=True) == ["state"] * len(ids)


def hub_process_other_than(bed, old) -> bool:
    try:
        return hub_process(bed) != old
    except ValueError:  # none yet
        return False


def test_a_controller_job_that_exits_at_once_is_reported_and_the_next_start_works(slurm, tmp_path):
    """The docs' old ``python3 -m ...`` in a job finds an interpreter without the
    package. ipcluster says so, with the log's last lines, and exits 1 (it waited
    60 s, hung, and left a cluster file that blocked the next start); the same
    profile then starts a cluster whose controller is a Slurm job on a node,
    which survives the death of the controller's main process (issue 59)."""
    if not os.path.exists("/usr/bin/python3"):
        pytest.skip("no /usr/bin/python3: an interpreter without this package is needed")
    shm_before = set(os.listdir("/dev/shm"))
    config = BOTH_BY_SLURM.format(per_node=PER_NODE)
    broken = IPCluster(slurm, config + BROKEN)
    out = broken.start(N).proc.communicate(timeout=300)[0]  # within the 600 s the files were waited for
    assert broken.proc.returncode == 1, out
    assert "No module named 'ipyparallel_broadcast'" in out and "The controller did not start" in out
    assert not glob.glob(os.path.join(broken.security, "cluster-*.json"))
    assert slurm.jobs() == []

    cluster = IPCluster(slurm, config, profile_dir=broken.profile_dir).start(N)
    rc = None
    try:
        rc = client(cluster)
        layout = rc.broadcast_tree()
        assert (layout.depth, layout.fanout) == (0, 2)  # 'auto' for 12 engines, 2 of 3 hosts behind relays
        relays = [n for n in rc.broadcast_stats() if n.get("host")]
        # the controller's node runs engines direct; each other node has its host relay
        assert sorted(n["engines"] for n in relays) == [PER_NODE] * (NODES - 1)
        every_operation(rc, False)
        kill_the_hub_and_find_the_cluster_kept(rc, slurm.bed)
    finally:
        if rc is not None:  # (a client that could not connect: the error above is the one to see)
            rc.close()
        out = cluster.stop()
    assert "already running" not in out
    assert cluster.left_behind(shm_before) == {}
