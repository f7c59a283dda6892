"""ipyparallel's own MPI cluster tests (``ipyparallel.tests.test_mpi``:
start/stop, signal, restart, get_output, to/from dict) with our controller
and engines started by its ``mpi`` launchers (MPICH's ``mpiexec``, on this host).
"""

import sys

import pytest
from ipyparallel.tests.test_mpi import (  # noqa: F401  (upstream's tests, by import)
    test_get_output,
    test_restart_engines,
    test_signal_engines,
    test_start_stop_cluster,
    test_to_from_dict,
)
from test_mpi import needs_mpi
from traitlets.config import Config

pytestmark = pytest.mark.asyncio  # all five are coroutines


@pytest.fixture
def cluster_config():
    needs_mpi()
    c = Config()
    c.MPIControllerLauncher.controller_cmd = [sys.executable, "-m", "ipyparallel_broadcast.controller"]
    c.MPIEngineSetLauncher.engine_cmd = [sys.executable, "-m", "ipyparallel_broadcast.engine"]
    return c


@pytest.fixture
def engine_launcher_class():
    return "mpi"


@pytest.fixture
def controller_launcher_class():
    return "mpi"
