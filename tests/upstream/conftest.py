"""Harness: run ipyparallel's own test modules against our controller.

ipyparallel ships its tests in its wheel (``ipyparallel.tests``). Their
fixtures start ``ipyparallel.tests.ipcontroller_cmd_argv``; we point that at
``python -m ipyparallel_broadcast.controller`` with the tree shape from
``IPB_UPSTREAM_DEPTH`` / ``IPB_UPSTREAM_FANOUT`` (default depth 1, fanout 2).
``IPB_UPSTREAM_ENGINES=ours`` starts our engines (``ipyparallel_broadcast.engine``:
outputs in the reply, the lean apply path) instead of stock ``ipengine``s.
Nothing of theirs is copied: fixtures are imported, classes re-exported.
"""

import os
import sys

import ipyparallel.tests as ipp_tests
from ipyparallel.tests.conftest import (  # noqa: F401  (fixtures, by import)
    Cluster,
    Context,
    cluster,
    cluster_config,
    controller_launcher_class,
    engine_launcher_class,
    ipython,
    ipython_dir,
    ipython_interactive,
)
from ipyparallel.tests.conftest import pytest_collection_modifyitems  # noqa: F401

DEPTH = os.environ.get("IPB_UPSTREAM_DEPTH", "1")
FANOUT = os.environ.get("IPB_UPSTREAM_FANOUT", "2")

if os.environ.get("IPB_UPSTREAM_ENGINES", "stock") == "ours":
    ipp_tests.ipengine_cmd_argv = [sys.executable, "-m", "ipyparallel_broadcast.engine"]

ipp_tests.ipcontroller_cmd_argv = [
    sys.executable,
    "-m",
    "ipyparallel_broadcast.controller",
    f"--BroadcastController.depth={DEPTH}",
    f"--BroadcastController.fanout={FANOUT}",
]
