"""One source per figure (issue 60): every figure the docs quote is a link to
the results file that measured it, and that file holds it; a value given (a
setting, a size) is code. The rule and its reader: ``tests/figures.py``."""

import os

import figures
import pytest

pytestmark = pytest.mark.pure


@pytest.mark.parametrize("page", figures.pages(), ids=lambda p: os.path.relpath(p, figures.ROOT))
def test_every_figure_on_the_page_has_its_source(page):
    assert [str(f) for f in figures.check(page)] == []


@pytest.fixture
def results(tmp_path, monkeypatch):
    """A results folder of one file, ``run.md``, and a docs folder beside it."""
    (tmp_path / "results").mkdir()
    (tmp_path / "docs").mkdir()
    (tmp_path / "results" / "run.md").write_text("| view | round trip (ms) |\n| ours | 98.9 |\n| stock | 17.6 |\n")
    monkeypatch.setattr(figures, "RESULTS", str(tmp_path / "results"))
    return tmp_path


def test_a_figure_without_a_source_is_found(results):
    page = results / "docs" / "page.md"
    page.write_text("A call takes 12.3 ms, `0.8 s` is given, `Client.timeout` (10 s) a default.\n")
    assert [f.figure for f in figures.check(str(page))] == ["12.3 ms"]


def test_a_linked_figure_must_be_in_its_results_file(results):
    page = results / "docs" / "page.md"
    page.write_text("[99 ms](../results/run.md), [17.6 µs](../results/run.md) and [12.3 ms](../results/run.md).\n")
    # the file says 98.9 (quoted as 99) and 17.6, and no 12.3
    assert [(f.figure, "not in run.md" in f.why) for f in figures.check(str(page))] == [("12.3 ms", True)]


def test_a_tables_figures_are_held_by_the_file_its_caption_links(results):
    page = results / "docs" / "page.md"
    page.write_text(
        "Measured ([run.md](../results/run.md)):\n\n| view | round trip (ms) |\n|---|---:|\n"
        "| ours | 99 |\n| stock | 17.6 |\n| other | 45.1 |\n\nNo caption:\n\n| view | time |\n|---|---|\n| x | 5 ms |\n"
    )
    assert [(f.line, f.figure) for f in figures.check(str(page))] == [(7, "45.1"), (13, "5 ms")]


def test_figures_in_fenced_blocks_and_ranges_are_read_as_one():
    text = figures.prose("```\n5 ms\n```\nfrom 1.2–2.1 s, 8 × 4 engines, 2 × `node_timeout`, 1.13 × the bound\n")
    assert figures.FIGURE.findall(text) == ["1.2–2.1 s", "1.13 ×"]
