"""HTML pictures for Jupyter (``_repr_html_``): the tree with each node's
load, the stats survey as a table, a traced call's timeline. Pure functions
of what the client already holds; terminals keep the plain-text reprs.

Colours name roles, the same in every picture: relay nodes blue, host relays
orange, engines green, trouble (drops, a node that did not answer) red.
"""

from __future__ import annotations

import html
from collections.abc import Iterable

from .grouping import engine_ranges

RELAY, HOST, ENGINES, TROUBLE, RULE = "#cfe2f3", "#fce5cd", "#d9ead3", "#f4cccc", "#999999"
MARKS = {
    "request in": "#1f77b4",
    "request out": "#1f77b4",
    "received": "#2ca02c",
    "started": "#2ca02c",
    "finished": "#ff7f0e",
    "reply in": "#9467bd",
    "reply out": "#9467bd",
    "done": "#d62728",
}
BOX = "display:inline-block;border-radius:4px;padding:2px 6px;margin:2px;font:12px monospace"


def _chip(text: str, colour: str, title: str = "") -> str:
    tip = f" title='{html.escape(title)}'" if title else ""
    return f"<span style='{BOX};background:{colour}'{tip}>{html.escape(text)}</span>"


def _engines(eids) -> str:
    eids = list(eids)
    return _chip(f"engines {engine_ranges(eids)} ({len(eids)})" if eids else "no engines", ENGINES)


def _load(stats: dict | None) -> str:
    """A node's figures from the survey: pending calls, drops, RSS."""
    if not stats:
        return ""
    if stats.get("error"):
        return " " + _chip(f"no answer: {stats['error']}", TROUBLE)
    parts = [f"pending {stats.get('pending', 0)}", f"dropped {stats.get('dropped', 0)}"]
    if isinstance(stats.get("rss"), (int, float)):
        parts.append(f"{stats['rss'] / 2**20:.0f} MB")
    colour = TROUBLE if stats.get("dropped") else "#eeeeee"
    return " " + _chip(", ".join(parts), colour)


def tree_html(shape, leaves: dict[int, list], hosts: dict[str, tuple], nodes: dict[str, dict]) -> str:
    """The tree, one nested block per relay node; under each leaf its host
    relays and engines. ``nodes``: survey entries by node name."""
    from ...wire.topology import node_name

    def block(path) -> str:
        name = node_name(path)
        head = _chip(name if not path else f"node {name}", RELAY) + _load(nodes.get(name))
        if shape.is_leaf(path):
            leaf = shape.leaf_index(path)
            inner = [_engines(leaves.get(leaf, []))] if leaves.get(leaf) else []
            for label, (at, eids) in sorted(hosts.items()):
                if at == leaf:
                    inner.append(f"<div>{_chip('host ' + label, HOST)}{_load(nodes.get(label))} {_engines(eids)}</div>")
        else:
            inner = [block(path + (k,)) for k in range(shape.fanout)]
        body = "".join(
            f"<div style='margin-left:1.5em;border-left:2px solid {RULE};padding-left:6px'>{part}</div>"
            for part in inner
        )
        return f"<div>{head}{body}</div>"

    engines = sum(len(v) for v in leaves.values()) + sum(len(e) for _, e in hosts.values())
    title = (
        f"<b>broadcast tree</b>: depth {shape.depth}, fan-out {shape.fanout}, "
        f"{shape.n_nodes} relay nodes, {len(hosts)} host relays, {engines} engines"
    )
    return f"<div class='ipb-tree' style='font:12px sans-serif'>{title}{block(())}</div>"


STATS_COLUMNS = [
    ("node", None),
    ("pid", None),
    ("pending", None),
    ("parked", None),
    ("dropped", None),
    ("engines", None),
    ("rss", 2**20),
    ("busy", None),
    ("cpu", None),
]


def stats_html(nodes: Iterable[dict]) -> str:
    """The survey as a table; RSS in MB, busy and CPU in seconds, with a bar
    for each node's share of the busiest node's busy time."""
    nodes = list(nodes)
    busiest = max((n.get("busy") or 0 for n in nodes), default=0) or 1
    head = "".join(f"<th>{name if name != 'rss' else 'RSS (MB)'}</th>" for name, _ in STATS_COLUMNS)
    rows = []
    for n in nodes:
        cells = []
        for name, unit in STATS_COLUMNS:
            value = n.get(name)
            if isinstance(value, float) or unit:
                value = "" if value is None else f"{value / (unit or 1):.2f}"
            cells.append(f"<td>{html.escape(str('' if value is None else value))}</td>")
        width = 100 * (n.get("busy") or 0) / busiest
        cells.append(f"<td><div style='background:{RELAY};width:{width:.0f}px;height:10px'></div></td>")
        colour = TROUBLE if n.get("error") or n.get("dropped") else ("#ffffff" if len(rows) % 2 else "#f6f6f6")
        rows.append(f"<tr style='background:{colour}'>{''.join(cells)}</tr>")
    return (
        f"<table class='ipb-stats' style='font:12px monospace;border-collapse:collapse'>"
        f"<tr>{head}<th>share of the busiest</th></tr>{''.join(rows)}</table>"
    )


def trace_svg(events: list[dict], width: int = 640) -> str:
    """A call's timeline: one row per place, a grey span from its first to its
    last event, a coloured mark per event; ms since the request went out."""
    from .trace import _origin, spans

    if not events:
        return "<i>no events</i>"
    t0, rows = _origin(events), list(spans(events))
    end = max((e["time"] - t0) * 1e3 for e in events) or 1.0
    left, right, row_h, top = 110, 40, 18, 8
    height = top + row_h * len(rows) + 40

    def x(ms):
        return left + (width - left - right) * ms / end

    parts = [
        f"<svg xmlns='http://www.w3.org/2000/svg' class='ipb-trace' width='{width}' height='{height}' "
        "style='font:11px sans-serif'>"
    ]
    for i, (place, (first, last)) in enumerate(spans(events).items()):
        y = top + row_h * i + row_h / 2
        parts.append(f"<text x='{left - 6}' y='{y + 4}' text-anchor='end'>{html.escape(place)}</text>")
        parts.append(
            f"<line x1='{x(first):.1f}' x2='{x(last):.1f}' y1='{y}' y2='{y}' stroke='#cccccc' stroke-width='6'/>"
        )
    for e in events:
        y = top + row_h * rows.index(e["where"]) + row_h / 2
        ms = (e["time"] - t0) * 1e3
        parts.append(
            f"<circle cx='{x(ms):.1f}' cy='{y}' r='4' fill='{MARKS.get(e['event'], '#555555')}'>"
            f"<title>{html.escape(e['where'])}: {html.escape(e['event'])} at {ms:.3f} ms</title></circle>"
        )
    axis = top + row_h * len(rows) + 4
    parts.append(f"<line x1='{left}' x2='{width - right}' y1='{axis}' y2='{axis}' stroke='{RULE}'/>")
    for k in range(5):
        ms = end * k / 4
        parts.append(f"<text x='{x(ms):.1f}' y='{axis + 14}' text-anchor='middle'>{ms:.1f}</text>")
    parts.append(f"<text x='{width - right}' y='{axis + 26}' text-anchor='end'>ms since the request went out</text>")
    return "".join(parts) + "</svg>"


class NodeStats(list):
    """``rc.broadcast_stats()``: a list of every node's survey entry, shown as a table in Jupyter."""

    def _repr_html_(self) -> str:
        return stats_html(self)


class Trace(list):
    """``ar.trace``: the events in time order; a timeline in Jupyter,
    ``timeline()`` as text, ``plot()`` with matplotlib."""

    def timeline(self) -> str:
        from .trace import timeline

        return timeline(self)

    def plot(self, ax=None):
        from .trace import plot

        return plot(self, ax)

    def _repr_html_(self) -> str:
        return trace_svg(self)
