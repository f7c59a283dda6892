"""The wheel, installed alone into a fresh virtual environment, as a user gets
it: run from outside the repository by ``.ci/wheel`` (``.ci/run`` calls it).

A 2-engine cluster from Python (broadcast in every reply mode, the
collectives, ``%px``), then ``ipcluster start --controller=broadcast`` and a
client. Run with the newest dependencies and with the oldest IPython Parallel
that ``pyproject.toml`` allows.
"""

import os
import subprocess
import sys
import tempfile

import ipyparallel
import numpy as np
from IPython.core.interactiveshell import InteractiveShell

import ipyparallel_broadcast as ipb

here = os.path.dirname(os.path.abspath(ipb.__file__))
assert "site-packages" in here, f"the package must come from the installed wheel, not {here}"
print("ipyparallel_broadcast", ipb.__version__, "from", here, "with ipyparallel", ipyparallel.__version__)

with tempfile.TemporaryDirectory(prefix="ipb-smoke-") as profile:
    cluster = ipb.Cluster(n=2, depth=1, fanout=2, profile_dir=profile, log_level=40)
    rc = cluster.start_and_connect_sync()
    try:
        pids = rc.broadcast_view().apply_sync(os.getpid)
        assert len(set(pids)) == 2, pids
        for mode in (True, False, ipb.Batch(2)):
            assert rc.broadcast_view(coalescing=mode).apply_sync(lambda x: x + 1, 1) == [2, 2], mode
        view = rc.broadcast_view(block=True)
        view.scatter("part", np.arange(10))
        assert np.array_equal(view.gather("part"), np.arange(10))
        assert view.map(lambda i: i * i, range(6)) == [0, 1, 4, 9, 16, 25]
        assert view.reduce(lambda: int(part.sum()), op="sum") == 45  # noqa: F821 (on the engines)
        shell = InteractiveShell.instance()  # %px, as in IPython or Jupyter
        view.activate()
        shell.run_line_magic("px", "px_value = 41 + 1")
        assert view.pull("px_value") == [42, 42]
        print("ipb.Cluster: apply in 3 reply modes, scatter, gather, map, reduce, %px: ok")
    finally:
        rc.close()
        cluster.stop_cluster_sync()

with tempfile.TemporaryDirectory(prefix="ipb-smoke-") as profile:
    ipcluster = os.path.join(os.path.dirname(sys.executable), "ipcluster")  # the environment's own
    where = f"--profile-dir={profile}"
    start = ["start", "-n", "2", where, "--controller=broadcast", "--engines=broadcast", "--daemonize"]
    subprocess.run([ipcluster, *start, "--BroadcastController.depth=1"], check=True, timeout=120)
    try:
        rc = ipb.Client(profile_dir=profile, timeout=60)
        rc.wait_for_engines(2, timeout=120)
        assert rc.broadcast_view().apply_sync(lambda: 7) == [7, 7]
        assert "depth=1" in str(rc.broadcast_tree())
        rc.close()
        print("ipcluster start --controller=broadcast: ok")
    finally:
        subprocess.run([ipcluster, "stop", where], check=True, timeout=120)
