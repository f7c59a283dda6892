"""The docs' figures and their sources, read from the pages' Markdown (issue 60).

A *figure* is a number with a unit of time (µs, ms, s, minutes), a ratio (×,
times, floors, %) or a byte rate (MB/s, GiB/s, ...) in a page's prose. Each is
either *sourced* or *given*:

- sourced: the text of a link to the results file that measured it, as in
  ``[99 ms](../benchmarks/results/center-16hosts.md)``; that file must hold
  each number of the link's text, to the precision quoted (98.9 holds 99). A
  table's figures are sourced by the results files linked in the paragraph
  just above the table, which must hold each number in its cells.
- given: in a code span (a setting, a size, a command's argument), or in
  brackets right after a setting's name in code (``Client.iopub_timeout``
  followed by "(10 s)").

``tests/test_figures.py`` fails on any other figure, and on a sourced one its
file does not hold.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
# generated, or not prose: the results pages themselves, the changelog (history), the references
SKIP = ("docs/results/", "docs/_build/", "docs/jupyter_execute/", "docs/changelog.md", "docs/config.md", "docs/api.md")

NUMBER = r"\d[\d,]*(?:\.\d+)?"
UNIT = r"(?:µs|us|ms|s|seconds|minutes|min|MB/s|GB/s|MiB/s|GiB/s|kB/s|×|times|floors|%)"
# (a × before a number, a code span or a bracket multiplies: 8 × 4 engines, 2 × `node_timeout`)
FIGURE = re.compile(
    rf"(?<![\w.,/-]){NUMBER}(?:\s?(?:-|–|to)\s?{NUMBER})?\s?{UNIT}(?![\w/])(?<!×)|"
    rf"(?<![\w.,/-]){NUMBER}(?:\s?(?:-|–|to)\s?{NUMBER})?\s?×(?!\s?[\d`(])"
)
LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")
# a code span, and a default in brackets after a setting's name (`Client.iopub_timeout`, `node_timeout`)
CODE = re.compile(r"`(?:[A-Z]\w*\.\w+|[a-z]+_\w+)`\s\([^()\n]*\)|`[^`\n]*`")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
NO_SOURCE = "has no source: link it to its results file, or code it if given"


def pages() -> list[str]:
    found = glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True) + [os.path.join(ROOT, "README.md")]
    return sorted(p for p in found if not os.path.relpath(p, ROOT).startswith(SKIP))


def numbers(text: str) -> list[str]:
    return [n.replace(",", "") for n in re.findall(NUMBER, text)]


def holds(source_text: str, quoted: str) -> bool:
    """Whether a number in ``source_text`` is ``quoted``, to the precision quoted (98.9 holds 99)."""
    decimals = len(quoted.partition(".")[2])
    want = float(quoted)
    return any(
        abs(float(n) - want) <= 0.5 * 10**-decimals + 1e-9
        for n in numbers(re.sub(r"(?<=\d),(?=\d{3})", "", source_text))
    )


def results_file(page: str, target: str) -> str | None:
    """The results file a link's target names, or None."""
    path = os.path.abspath(os.path.join(os.path.dirname(page), target.partition("#")[0]))
    name = os.path.basename(path)
    if os.path.dirname(path) in (RESULTS, os.path.join(ROOT, "docs", "results")) and name.endswith(".md"):
        return os.path.join(RESULTS, name)
    return None


@dataclass
class Finding:
    page: str
    line: int
    figure: str
    why: str

    def __str__(self):
        return f"{os.path.relpath(self.page, ROOT)}:{self.line}: {self.figure!r} {self.why}"


def prose(text: str) -> str:
    """The page without its fenced blocks (their lines kept, blank) and code spans."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return CODE.sub("`c`", text)


def read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def sources(page: str, text: str) -> list[str]:
    """The results files the links in ``text`` name."""
    return [s for s in (results_file(page, m.group(2)) for m in LINK.finditer(text)) if s]


def check(page: str) -> list[Finding]:
    """Every figure on ``page`` without a source, or whose source does not hold it."""
    found = []
    lines = prose(read(page)).splitlines()
    for lineno, line in enumerate(lines, 1):
        caption = table_caption(lines, lineno - 1)
        if caption is None:
            found += check_line(page, lineno, line)
        else:  # a table row: its source is named above the table
            found += check_row(page, lineno, line, lineno - 1 == caption[0], sources(page, caption[1]))
    return found


def check_line(page: str, lineno: int, line: str, named: list[str] = ()) -> list[Finding]:
    """A line of prose, or a table's row (``named``: the sources its table names):
    each figure in a link to its results file, and held there."""
    found = []

    def link(m):
        source = results_file(page, m.group(2))
        if source is None:
            return m.group(1)  # an ordinary link: its text is prose
        found.extend(unheld(page, lineno, [m.group(1)] if numbers(m.group(1)) else [], [source]))  # each number
        return " " * len(m.group(0))

    rest = LINK.sub(link, line)
    if not named:
        return found + [Finding(page, lineno, figure, NO_SOURCE) for figure in FIGURE.findall(rest)]
    cells = [c.strip() for c in rest.strip().strip("|").split("|")]
    plain = [c for c in cells[1:] if re.fullmatch(rf"\**{NUMBER}\**", c)]  # a number in a column of figures
    return found + unheld(page, lineno, FIGURE.findall(rest) + plain, named)


def table_caption(lines: list[str], i: int):
    """For a table's row ``lines[i]``: (the index of the table's first row, the
    paragraph above the table); None for a line outside a table."""
    if not lines[i].lstrip().startswith("|"):
        return None
    first = i
    while first > 0 and lines[first - 1].lstrip().startswith("|"):
        first -= 1
    top = first - 1
    while top >= 0 and not lines[top].strip():
        top -= 1
    above = top
    while above >= 0 and lines[above].strip() and not lines[above].startswith("#"):
        above -= 1
    return first, "\n".join(lines[above + 1 : top + 1])


def check_row(page: str, lineno: int, row: str, header: bool, named: list[str]) -> list[Finding]:
    """A table row: its figures, and its numbers where the table names its
    source (a link in the paragraph above it), must be held there."""
    if header or set(row.replace("|", "").strip()) <= set("-: "):
        return [] if named else check_line(page, lineno, row)  # a header's words, or a rule
    return check_line(page, lineno, row, named)


def unheld(page: str, lineno: int, figures: list[str], named: list[str]) -> list[Finding]:
    """The figures none of the ``named`` results files holds."""
    texts = [read(n) for n in named]
    out = []
    for figure in figures:
        missing = [n for n in numbers(figure) if not any(holds(t, n) for t in texts)]
        if missing:
            where = ", ".join(os.path.basename(n) for n in named)
            out.append(Finding(page, lineno, figure, f"is not in {where} ({missing})"))
    return out
