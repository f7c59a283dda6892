"""Per-hop traces on a real cluster: every hop stamps a traced call, in
causal order, and the timeline can be shown and plotted."""

import pytest
from cluster_util import running_cluster

from ipyparallel_broadcast.client.display import trace as T

pytestmark = pytest.mark.cluster

N = 4
SLACK = 0.005  # s: engines' ISO dates are cut to microseconds; one host, one clock


@pytest.fixture(scope="module")
def rc():
    with running_cluster(N, 1, 2) as client:
        yield client


def first(events, where, what):
    return min(e["time"] for e in events if e["where"] == where and e["event"] == what)


def last(events, where, what):
    return max(e["time"] for e in events if e["where"] == where and e["event"] == what)


@pytest.mark.parametrize("coalescing", [True, False, 2], ids=["coalescing", "streaming", "batch"])
def test_every_hop_stamps_a_traced_call_in_causal_order(rc, coalescing):
    view = rc.broadcast_view(coalescing=coalescing, trace=True)
    ar = view.apply_async(lambda: 1)
    assert ar.get(30) == [1] * N
    events = ar.trace
    places = {e["where"] for e in events}
    assert places == {"client", "root", "node 0", "node 1"} | {f"engine {e}" for e in rc.ids}
    assert [e["time"] for e in events] == sorted(e["time"] for e in events)
    layout = rc.broadcast_tree().leaves
    for leaf, eids in layout.items():
        node = f"node {leaf}"
        down = [
            first(events, "client", "request out"),
            first(events, "root", "request in"),
            first(events, "root", "request out"),
            first(events, node, "request in"),
            first(events, node, "request out"),
        ]
        assert down == sorted(down)
        for eid in eids:
            engine = f"engine {eid}"
            path = down + [
                first(events, engine, "received"),
                first(events, engine, "started"),
                first(events, engine, "finished"),
            ]
            assert all(b >= a - SLACK for a, b in zip(path, path[1:]))
            replied = [
                e["time"] for e in events if e["where"] == node and e["event"] == "reply in" and e["detail"] == engine
            ]
            assert len(replied) == 1 and replied[0] >= path[-1] - SLACK
        up = [
            last(events, node, "reply in"),
            last(events, node, "reply out"),
            last(events, "root", "reply in"),
            last(events, "root", "reply out"),
            last(events, "client", "reply in"),
            last(events, "client", "done"),
        ]
        assert up == sorted(up)
    # coalescing: one message at the client; batch(2): one per leaf; streaming: one per
    # engine at most (replies a relay reads together go up together)
    replies_in = sum(e["where"] == "client" and e["event"] == "reply in" for e in events)
    if coalescing is False:
        assert 1 <= replies_in <= N
    else:
        assert replies_in == {True: 1, 2: len(layout)}[coalescing]


def test_untraced_calls_have_no_trace_and_cost_no_stamps(rc):
    view = rc.broadcast_view()
    ar = view.apply_async(lambda: 2)
    assert ar.get(30) == [2] * N
    with pytest.raises(KeyError, match="not traced"):
        _ = ar.trace
    assert all(n["trace"] == [] for n in rc.broadcast_stats(trace=ar._children[0].broadcast_id))
    with view.temp_flags(trace=True):  # a flag, for one call
        traced = view.apply_async(lambda: 3)
    assert traced.get(30) == [3] * N and len(traced.trace) > 4 * N


def test_collectives_are_traced_too(rc):
    view = rc.broadcast_view(trace=True)
    view.scatter("x", list(range(8)), block=True)
    ar = view.gather("x", block=False)
    assert ar.get(30) == list(range(8))
    assert {e["where"] for e in ar.trace} >= {"client", "root"} | {f"engine {e}" for e in rc.ids}


def test_the_timeline_shows_and_plots(rc):
    import matplotlib

    matplotlib.use("Agg")
    ar = rc.broadcast_view(trace=True).apply_async(lambda: 4)
    ar.get(30)
    events = ar.trace
    text = T.timeline(events)
    assert text.splitlines()[1].split()[:3] == ["0.000", "client", "request"]  # from the send
    assert len(text.splitlines()) == len(events) + 1
    spans = T.spans(events)
    assert spans["client"][0] == 0 and all(lo <= hi for lo, hi in spans.values())
    ax = T.plot(events)
    assert [t.get_text() for t in ax.get_yticklabels()] == list(spans)
