"""The notebooks are committed without outputs: they run, with their outputs,
in the docs build (``test_docs.py``), and ``live_tree`` in a browser
(``test_jupyter_reprs.py``)."""

import json
import os

import pytest

pytestmark = pytest.mark.pure

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = os.path.join(ROOT, "notebooks")


@pytest.mark.parametrize("name", ["broadcast_demo.ipynb", "benchmark_results.ipynb", "live_tree.ipynb"])
def test_committed_without_outputs(name):
    with open(os.path.join(NOTEBOOKS, name)) as f:
        nb = json.load(f)  # (the notebook format is JSON: no nbformat for a pure test)
    assert nb["nbformat"] == 4
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None
