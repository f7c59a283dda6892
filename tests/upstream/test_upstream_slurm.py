"""ipyparallel's own Slurm cluster tests (``ipyparallel.tests.test_slurm``:
start/stop, signal, restart, get_output, to/from dict) with our controller and
engines (the ``broadcast-slurm`` launchers), on a real Slurm across the
multi-host bed. Upstream runs them on docker-compose's Slurm with a shared
``/data``; the bed's hosts share this machine's disk.
"""

import os
from unittest import mock

import pytest
from cluster_util import skip_or_fail
from ipyparallel.tests.conftest import temporary_ipython_dir
from ipyparallel.tests.test_slurm import (  # noqa: F401  (upstream's tests, by import)
    longer_timeout,
    test_get_output,
    test_restart_engines,
    test_signal_engines,
    test_start_stop_cluster,
    test_to_from_dict,
)
from traitlets.config import Config

from ipyparallel_broadcast.tools.netbed import NetBed
from ipyparallel_broadcast.tools.slurmbed import SlurmBed

pytestmark = [pytest.mark.multihost, pytest.mark.asyncio]  # all five are coroutines


@pytest.fixture(autouse=True, scope="module")
def ipython_dir():
    why = SlurmBed.available()
    if why:
        skip_or_fail(why, "IPython Parallel's Slurm tests")
    here = os.getcwd()
    with NetBed(hosts=3) as bed, SlurmBed(bed, cpus=5) as slurm:
        with mock.patch.dict(os.environ, SLURM_CONF=slurm.conf), temporary_ipython_dir() as ipython_dir:
            os.chdir(ipython_dir)  # upstream's clusters write their batch scripts where they run
            try:
                yield ipython_dir
            finally:
                os.chdir(here)


@pytest.fixture
def cluster_config():
    c = Config()
    c.Cluster.controller_ip = "0.0.0.0"  # as upstream's: the controller is a job on some node
    return c


@pytest.fixture
def engine_launcher_class():
    return "broadcast-slurm"


@pytest.fixture
def controller_launcher_class():
    return "broadcast-slurm"
