"""JupyterLab in a real browser (issue 46): IPython Parallel's cluster panel
starts a broadcast cluster from a profile that names our launchers, and a
notebook runs ``rc.broadcast_view()``, ``%px`` with grouped outputs, the live
tree and a reduce, in headless Chromium (``tools/jupyterlab.py``).

Needs Chromium (``apt-get install chromium``): without it this test skips and
says why; under ``CI=true`` it fails.
"""

import pytest
from cluster_util import skip_or_fail, until

from ipyparallel_broadcast.tools import jupyterlab

pytestmark = pytest.mark.cluster


def test_the_cluster_panel_starts_a_broadcast_cluster_and_a_notebook_uses_it(tmp_path):
    why = jupyterlab.available()
    if why:
        skip_or_fail(why, "the JupyterLab test")
    with jupyterlab.Lab() as lab:
        seen = jupyterlab.drive(lab, screenshot=str(tmp_path / "lab.png"))
        until(lambda: not lab.cluster_processes(), timeout=60, what="STOP to end the cluster's processes")
    assert f"Number of engines: {jupyterlab.ENGINES}" in seen["state"]
    assert "ipp.Cluster.from_file(" in seen["code"] and "connect_client_sync()" in seen["code"]
    client, made_ours, px, tree, reduced = seen["outputs"]
    assert "ipyparallel.client.client.Client" in client  # the panel's code gives a stock client
    assert "view: ipyparallel_broadcast.client.view BroadcastView" in made_ours
    assert "[stdout:0,2 (2 engines)]" in px and "[stdout:1,3 (2 engines)]" in px  # grouped by equality
    assert "even" in px and "odd" in px
    assert "broadcast tree: depth 1, fan-out 2, 3 relay nodes" in tree and "engines 0,2 (2)" in tree
    assert reduced.split()[-1] == str(jupyterlab.ENGINES)
    assert "State: Stopped" in seen["stopped"]
    assert seen["processes"] >= 1 + jupyterlab.ENGINES  # the controller and engines, then none
    assert (tmp_path / "lab.png").stat().st_size > 0
