"""Both notebooks run top to bottom in a real kernel (nbclient): the demo
against a live local cluster, the results notebook on the committed result
files. They are committed without outputs."""

import os

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.cluster

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = os.path.join(ROOT, "notebooks")


def execute(name, timeout=300):
    path = os.path.join(NOTEBOOKS, name)
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": NOTEBOOKS}}).execute()
    return nb


def outputs(nb, kind="stream"):
    return "".join(
        o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == kind
    )


@pytest.mark.parametrize("name", ["broadcast_demo.ipynb", "benchmark_results.ipynb", "live_tree.ipynb"])
def test_committed_without_outputs(name):
    nb = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None


def test_broadcast_demo_runs_against_a_live_cluster(monkeypatch):
    monkeypatch.setenv("IPB_DEMO_ENGINES", "4")
    nb = execute("broadcast_demo.ipynb")
    text = outputs(nb)
    assert "broadcast tree: depth=2 fanout=2" in text
    assert "Batch(count=2" in text  # every reply mode ran
    assert "pending 0" in text


def test_benchmark_results_plots_the_committed_results(monkeypatch, tmp_path):
    figure = tmp_path / "figure.png"
    monkeypatch.setenv("IPB_FIGURE", str(figure))
    nb = execute("benchmark_results.ipynb")
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 3  # by engine count/depth/size for each machine, and the farm
    assert figure.stat().st_size > 10_000 and figure.read_bytes()[:4] == b"\x89PNG"
