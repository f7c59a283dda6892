"""The HTML reprs' content, without a browser (``test_jupyter_reprs.py`` renders
them in Chromium): one chip per node, host relay and leaf's engines, trouble in
red, a table row per surveyed node, a timeline row per place and a mark per event."""

import re

import pytest

from ipyparallel_broadcast.client.display import reprs
from ipyparallel_broadcast.client.treeinfo import TreeLayout
from ipyparallel_broadcast.wire.topology import TreeShape

pytestmark = pytest.mark.pure

NODES = [
    dict(node="root", pid=1, pending=0, parked=0, dropped=0, engines=None, rss=50 * 2**20, busy=0.5, cpu=1.0),
    dict(node="0", pid=2, pending=1, parked=0, dropped=2, engines=3, rss=40 * 2**20, busy=0.2, cpu=0.4),
    dict(node="1", error="timed out"),
    dict(node="host a", host="a", eids=[6, 7], pending=0, dropped=0),
]


def chips(page, colour):
    return re.findall(rf"background:{colour}'[^>]*>([^<]*)<", page)


def test_the_tree_shows_every_node_host_and_leaf_with_its_load():
    layout = TreeLayout(TreeShape(1, 2), range(8), {"a": (1, [6, 7])}, NODES)
    page = layout._repr_html_()
    assert chips(page, reprs.RELAY) == ["root", "node 0", "node 1"]
    assert chips(page, reprs.HOST) == ["host a"]
    assert chips(page, reprs.ENGINES) == ["engines 0,2,4 (3)", "engines 1,3,5 (3)", "engines 6-7 (2)"]
    assert chips(page, reprs.TROUBLE) == ["pending 1, dropped 2, 40 MB", "no answer: timed out"]
    assert "pending 0, dropped 0, 50 MB" in page
    assert repr(layout).startswith("broadcast tree: depth=1 fanout=2")  # terminals keep the text


def test_the_stats_table_has_a_row_per_node_and_marks_trouble():
    page = reprs.NodeStats(NODES)._repr_html_()
    rows = re.findall(r"<tr style='background:([^']*)'>", page)
    assert len(rows) == 4 and rows[1] == rows[2] == reprs.TROUBLE and rows[0] != reprs.TROUBLE
    assert "<td>50.00</td>" in page  # RSS in MB


def test_the_timeline_has_a_row_per_place_and_a_mark_per_event():
    events = [
        dict(where=w, event=e, time=t, detail=None)
        for w, e, t in [
            ("client", "request out", 100.000),
            ("root", "request in", 100.001),
            ("engine 0", "started", 100.003),
            ("engine 1", "started", 100.004),
            ("root", "reply out", 100.006),
            ("client", "done", 100.008),
        ]
    ]
    svg = reprs.Trace(events)._repr_html_()
    assert re.findall(r"text-anchor='end'>([^<]*)<", svg)[:4] == ["client", "root", "engine 0", "engine 1"]
    assert svg.count("<circle") == len(events) and svg.count("stroke-width='6'") == 4
    assert "at 8.000 ms" in svg  # the last event, ms since the request went out
    assert reprs.Trace(events).timeline().splitlines()[1].split()[:2] == ["0.000", "client"]
