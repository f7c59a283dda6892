"""One source per figure (issue 60): every figure the docs quote is a link to
the results file that measured it, and that file holds it; a value given (a
setting, a size) is code. The rule and its parser: ``tests/figures.py``."""

import os

import figures
import pytest

pytestmark = pytest.mark.pure


@pytest.mark.parametrize("page", figures.pages(), ids=lambda p: os.path.relpath(p, figures.ROOT))
def test_every_figure_on_the_page_has_its_source(page):
    assert [str(f) for f in figures.check(page)] == []


def test_a_figure_without_a_source_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("A call takes 12.3 ms, `0.8 s` is given, `Client.timeout` (10 s) a default.\n")
    assert [f.figure for f in figures.check(str(page))] == ["12.3 ms"]


def test_a_linked_figure_must_be_in_its_results_file(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    page = docs / "page.md"
    target = os.path.relpath(os.path.join(figures.RESULTS, "center-16hosts.md"), docs)
    # the file says 98.9 ms (quoted as 99 ms) and 17.6 µs; it says no 12.3 ms
    page.write_text(f"[99 ms]({target}), [17.6 µs]({target}) and [12.3 ms]({target}).\n")
    assert [(f.figure, "not in center-16hosts.md" in f.why) for f in figures.check(str(page))] == [("12.3 ms", True)]


def test_figures_in_fenced_blocks_and_ranges_are_read_as_one():
    text = figures.prose("```\n5 ms\n```\nfrom 1.2–2.1 s\n")
    assert figures.FIGURE.findall(text) == ["1.2–2.1 s"]
