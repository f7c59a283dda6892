"""MPI launch across the multi-host bed (issue 46): ``ipcluster start`` with
IPython Parallel's ``mpi`` engine launcher, MPICH's hydra placing our engines
on 3 engine hosts (``tools/mpibed.py``).

Needs root, MPICH (Debian's ``mpich``) and mpi4py built against it (``test.sh``
builds it when ``mpicc`` is there): without them these tests skip and say why;
under ``CI=true`` they fail.
"""

import os
import sys
import tempfile

import ipyparallel as ipp
import pytest
from cluster_util import every_operation, skip_or_fail

import ipyparallel_broadcast as ipb
from ipyparallel_broadcast.tools import mpibed
from ipyparallel_broadcast.tools.bedcluster import IPCluster
from ipyparallel_broadcast.tools.netbed import NetBed

pytestmark = pytest.mark.multihost

PER_HOST, HOSTS = 2, 3
N = PER_HOST * HOSTS
MODES = [True, False, ipb.Batch(2)]
MODE_IDS = ["coalescing", "streaming", "batch2"]

CONFIG = """
c.Cluster.controller_launcher_class = "broadcast"
c.Cluster.engine_launcher_class = "mpi"
c.Cluster.controller_ip = "{addr}"
c.MPIEngineSetLauncher.engine_cmd = [{python!r}, "-m", "ipyparallel_broadcast.engine"]
c.MPIEngineSetLauncher.mpi_args = {mpi_args!r}
c.BroadcastEngine.compose = "static"
"""


def needs_mpi():
    why = mpibed.available()
    if why is None:
        try:
            import mpi4py  # noqa: F401
        except ImportError:
            why = "MPI engines need mpi4py built against MPICH (pip install --no-binary mpi4py mpi4py)"
    if why:
        skip_or_fail(why, "the MPI tests")


@pytest.fixture(scope="module")
def mpi_cluster():
    needs_mpi()
    with NetBed(hosts=HOSTS) as bed, tempfile.TemporaryDirectory(prefix="ipb-hydra-") as tmp:
        hydra = mpibed.Hydra(bed, tmp)
        mpi_args = hydra.args([(h, PER_HOST) for h in bed.hosts])
        config = CONFIG.format(addr=bed.controller.addr, python=sys.executable, mpi_args=mpi_args)
        shm_before = set(os.listdir("/dev/shm"))
        cluster = IPCluster(bed, config).start(N)
        cluster.rc = ipb.Client(cluster.connection_file())
        cluster.shm_before = shm_before
        try:
            cluster.rc.wait_for_engines(N, timeout=120)
            yield cluster
        finally:
            cluster.rc.close()
            if cluster.proc.poll() is None:
                cluster.stop()
        # ipcluster stop, once every test is done with the cluster, whatever their order
        assert cluster.left_behind(shm_before) == {}, "ipcluster stop left an MPI process or a shm name behind"


@ipp.interactive
def _place():
    import os

    from mpi4py import MPI

    from ipyparallel_broadcast.engine.compose import status
    from ipyparallel_broadcast.host.link import host_label

    return MPI.COMM_WORLD.rank, MPI.COMM_WORLD.size, host_label(), status()["launcher_engines"], os.getpid()


def test_mpi_engines_keep_their_ranks_behind_their_hosts_relays(mpi_cluster):
    rc = mpi_cluster.rc
    places = rc.broadcast_view().apply_sync(_place)
    assert [p[0] for p in places] == rc.ids == list(range(N))  # engine id = MPI rank
    assert {p[1] for p in places} == {N}
    relays = {n["host"]: sorted(n["eids"]) for n in rc.broadcast_stats() if n.get("host")}
    assert sorted(relays.values()) == [[0, 1], [2, 3], [4, 5]]  # hydra's placement, in rank order
    assert all(places[e][2] == host for host, eids in relays.items() for e in eids)
    assert [p[3] for p in places] == [PER_HOST] * N  # compose counts from MPICH's local ranks


def test_the_engines_run_mpi_among_themselves(mpi_cluster):
    view = mpi_cluster.rc.broadcast_view()
    view.execute("from mpi4py import MPI; total = MPI.COMM_WORLD.allreduce(MPI.COMM_WORLD.rank + 1)", block=True)
    assert view.pull("total", block=True) == [N * (N + 1) // 2] * N


@pytest.mark.parametrize("coalescing", MODES, ids=MODE_IDS)
def test_every_operation_on_mpi_engines(mpi_cluster, coalescing):
    every_operation(mpi_cluster.rc, coalescing)
