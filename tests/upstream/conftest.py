"""Harness: run ipyparallel's own test modules against our controller.

ipyparallel ships its tests in its wheel (``ipyparallel.tests``). Their
fixtures start ``ipyparallel.tests.ipcontroller_cmd_argv``; we point that at
``python -m ipyparallel_broadcast.controller`` with the tree shape from
``IPB_UPSTREAM_DEPTH`` / ``IPB_UPSTREAM_FANOUT`` (default depth 1, fanout 2).
Modules run on stock ``ipengine``s; the ``*_our_engines`` modules run the same
upstream classes on our engines (``ipyparallel_broadcast.engine``: outputs in
the reply, the lean apply path), by their own ``cluster`` fixture.
Nothing of theirs is copied: fixtures are imported, classes re-exported.

With ``xfail_strict`` on, an upstream xfail that passes here fails, so:
- ``MUST_PASS``: upstream's xfails that our tree must pass (README promises);
  their xfail marks are removed, and a regression is a plain failure;
- ``EMPTY``: tests upstream overrides with ``pass`` in its broadcast module;
  they are deselected, and ``tests/test_stock_clients.py`` tests them for real.
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
from ipyparallel.tests.conftest import pytest_collection_modifyitems as upstream_modifyitems

DEPTH = os.environ.get("IPB_UPSTREAM_DEPTH", "1")
FANOUT = os.environ.get("IPB_UPSTREAM_FANOUT", "2")

ipp_tests.ipcontroller_cmd_argv = [
    sys.executable,
    "-m",
    "ipyparallel_broadcast.controller",
    f"--BroadcastController.depth={DEPTH}",
    f"--BroadcastController.fanout={FANOUT}",
]

MUST_PASS = {
    ("TestBroadcastViewCoalescing", "test_target_ordering"),  # stock clients, in target order
}
EMPTY = {
    ("TestBroadcastView", "test_scatter_tracked"),
    ("TestBroadcastViewCoalescing", "test_scatter_tracked"),
    ("TestBroadcastView", "test_apply_displaypub"),
    ("TestBroadcastViewCoalescing", "test_apply_displaypub"),
}
HERE = os.path.dirname(os.path.abspath(__file__))


def pytest_collection_modifyitems(config, items):
    upstream_modifyitems(items)
    kept, empty = [], []
    for item in items:
        key = (getattr(item.cls, "__name__", None), item.originalname)
        if not str(item.path).startswith(HERE):
            kept.append(item)
        elif key in EMPTY:
            empty.append(item)
        else:
            if not item.get_closest_marker("multihost"):
                item.add_marker("cluster")  # upstream's clusters, real processes
            if key in MUST_PASS:
                item.own_markers[:] = [m for m in item.own_markers if m.name != "xfail"]
            kept.append(item)
    if empty:
        config.hook.pytest_deselected(items=empty)
        items[:] = kept
