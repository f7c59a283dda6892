"""Per-hop traces, read: merged, as a timeline and as a plot (what the client
notes of its own traced calls is ``client.traces``). When one broadcast passed
the client, each relay node and each engine, on the way down and back.

Turn it on per view (``rc.broadcast_view(trace=True)``, ``view.trace = True``
or ``with view.temp_flags(trace=True)``: ``apply``'s keyword arguments belong
to the function), then read ``ar.trace`` once the call is done. Events come
from three places:

- the client: ``request out`` (handed to zmq), ``reply in`` (each message
  from the root), ``done`` (every engine's outcome is in);
- each relay node, fetched with one stats survey: ``request in``, ``request
  out``, ``reply in`` (each engine's reply or each bundle from below),
  ``reply out``; for a push whose big buffers go host to host in chunks, the
  leaf's ``chunks out`` (its plan) and each host relay's ``first chunk in``
  and ``chunks in``;
- each engine, from its reply: ``received`` (our engines only), ``started``
  (request parsed, call begins) and ``finished`` (reply made).

Times are wall-clock seconds (``time.time()``), comparable across processes of
one host; across hosts they are as good as the hosts' clock sync.
"""

from __future__ import annotations

from ..traces import event


def merge(client_events: list, nodes: list) -> list[dict]:
    """The client's events and each surveyed node's, in time order."""
    events = list(client_events)
    for node in nodes:
        name = node.get("node")
        name = name if name == "root" or str(name).startswith("host ") else f"node {name}"
        for what, time, detail in node.get("trace") or ():
            events.append(event(name, what, time, detail))
    return sorted(events, key=lambda e: e["time"])


def _origin(events) -> float:
    sent = [e["time"] for e in events if e["where"] == "client" and e["event"] == "request out"]
    return min(sent or [e["time"] for e in events])


def timeline(events: list[dict]) -> str:
    """A text table: milliseconds since the client sent the request."""
    if not events:
        return "no events"
    t0 = _origin(events)
    lines = [f"{'ms':>9}  {'where':<12} {'event':<12} detail"]
    for e in events:
        detail = "" if e.get("detail") is None else e["detail"]
        lines.append(f"{(e['time'] - t0) * 1e3:9.3f}  {e['where']:<12} {e['event']:<12} {detail}")
    return "\n".join(lines)


def spans(events: list[dict]) -> dict[str, tuple]:
    """Each place's first and last event, in ms since the request went out."""
    t0, out = _origin(events) if events else 0.0, {}
    for e in events:
        first, last = out.get(e["where"], (None, None))
        t = (e["time"] - t0) * 1e3
        out[e["where"]] = (t if first is None else min(first, t), t if last is None else max(last, t))
    return out


MARKERS = {
    "request in": ">",
    "request out": ">",
    "received": ">",
    "started": "o",
    "finished": "s",
    "reply in": "<",
    "reply out": "<",
    "done": "*",
}


def plot(events: list[dict], ax=None):
    """A timeline of the events (matplotlib): one row per place, in order of
    first appearance; returns the axes."""
    try:
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError("Trace.plot needs matplotlib: pip install 'ipyparallel-broadcast[plot]'") from e

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 0.4 * len(spans(events)) + 1.5))
    rows = list(spans(events))
    t0 = _origin(events)
    for row, (first, last) in enumerate(spans(events).values()):
        ax.plot([first, last], [row, row], color="0.85", zorder=1)
    for k, what in enumerate(dict.fromkeys(e["event"] for e in events)):
        mine = [e for e in events if e["event"] == what]
        ax.scatter(
            [(e["time"] - t0) * 1e3 for e in mine],
            [rows.index(e["where"]) for e in mine],
            marker=MARKERS.get(what, "."),
            color=f"C{k}",
            label=what,
            zorder=2,
            s=24,
        )
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    ax.set_yticks(range(len(rows)), rows)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the client sent the request")
    return ax
