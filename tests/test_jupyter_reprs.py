"""The HTML reprs, in a real browser. ``notebooks/live_tree.ipynb`` runs
against a live cluster of 8 engines (depth 1, fan-out 2); its HTML export is
rendered by headless Chromium, and the screenshot is read pixel by pixel:
the tree's chips come in the tree's order (root, node 0, its engines, node 1,
its engines), and the trace has one row of engine marks per engine.
Without Chromium the tests skip, saying so; under ``CI=true`` they fail."""

import os

import numpy as np
import pytest
from cluster_util import skip_or_fail

from ipyparallel_broadcast.client.display import reprs
from ipyparallel_broadcast.tools import screenshot as shot

pytestmark = pytest.mark.cluster

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "notebooks", "live_tree.ipynb")


CHIP, MARK = 20, 3  # pixels of a colour in one row: a chip is wide, a trace mark 9 px across


def rgb(colour: str) -> np.ndarray:
    return np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)])


def bands(image: np.ndarray, colour: str, wide: int, tolerance: int = 3) -> list:
    """``(first row, last row)`` of each run of rows with at least ``wide``
    pixels of ``colour`` (a lone anti-aliased pixel of another shape is no chip)."""
    hit = (np.abs(image[:, :, :3].astype(int) - rgb(colour)) <= tolerance).all(axis=2).sum(axis=1) >= wide
    rows = np.flatnonzero(hit)
    out = []
    for r in rows:
        if out and r == out[-1][1] + 1:
            out[-1][1] = r
        else:
            out.append([r, r])
    return [tuple(b) for b in out]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    try:
        shot.chromium()
    except FileNotFoundError as e:  # a Debian package: CI installs it, a fresh machine may not have it
        skip_or_fail(str(e), "the reprs in a browser")
    os.environ["IPB_LIVE_ENGINES"] = "8"
    nb = shot.run_notebook(NOTEBOOK)
    png = str(tmp_path_factory.mktemp("shot") / "live_tree.png")
    shot.screenshot(shot.to_html(nb), png, width=1000, height=1800)
    import matplotlib.image

    image = (matplotlib.image.imread(png) * 255).round().astype(np.uint8)
    return nb, image


def html_outputs(nb) -> list:
    return [
        o["data"]["text/html"]
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
        if "text/html" in o.get("data", {})
    ]


def test_every_repr_gave_jupyter_html(rendered):
    nb, _ = rendered
    pages = html_outputs(nb)
    assert [p.split()[0] for p in pages] == ["<div", "<table", "<svg", "<div"]
    assert "ipb-tree" in pages[0] and pages[1].count("<tr") == 1 + 3  # header + root, node 0, node 1
    assert pages[3].count("<details") == 2 and "[stdout:0,2,4,6 (4 engines)]" in pages[3]


def test_the_tree_is_drawn_in_its_order(rendered):
    _, image = rendered
    assert image.shape[:2] == (1800, 1000)
    chips = sorted(
        [(b, "relay") for b in bands(image, reprs.RELAY, CHIP)]
        + [(b, "engines") for b in bands(image, reprs.ENGINES, CHIP)]
    )
    assert [kind for _, kind in chips[:5]] == ["relay", "relay", "engines", "relay", "engines"]
    assert len(bands(image, reprs.ENGINES, CHIP)) == 2  # one chip per leaf, nowhere else


def test_the_trace_has_a_row_of_marks_per_engine(rendered):
    _, image = rendered
    engine_rows = bands(image, reprs.MARKS["started"], MARK)
    assert len(engine_rows) == 8
    done = bands(image, reprs.MARKS["done"], MARK)
    assert len(done) == 1 and done[0][1] < engine_rows[0][0]  # the client's row comes first
