"""The chaos soak's checker, on made-up histories: each promise it checks
(every call ends, nothing lost, nothing twice, nothing misdelivered) is
caught when broken, and a clean history passes."""

import pytest

from ipyparallel_broadcast.tools.chaos.checker import cause_of, check, names_engine

pytestmark = pytest.mark.pure
BOUND = 60


def record(seq=1, op="apply", targets=(0, 1), ended=1.0, outcomes=None, **extra):
    outcomes = {str(e): ["ok", None] for e in targets} if outcomes is None else outcomes
    return dict(
        client="c0",
        seq=seq,
        op=op,
        mode="coalescing",
        targets=list(targets),
        sent=0.0,
        ended=ended,
        outcomes=outcomes,
        wrong=[],
        output_missing=[],
        **extra,
    )


def test_a_clean_history_passes():
    records = [record(1), record(2, outcomes={"0": ["ok", None], "1": ["error", "Engine 1 died before replying"]})]
    v = check(records, {"1-e.log": ["c0:1", "c0:2"]}, BOUND)
    assert v.clean and v.calls == 2 and v.executions == 2
    assert v.by_op["apply"] == {"ok": 1, "failed": 1} and v.errors_by_cause == {"died": 1}


def test_a_call_that_never_ended_or_ended_past_the_bound_is_hung():
    v = check([record(1, ended=None), record(2, ended=BOUND + 1.0), record(3)], {}, BOUND)
    assert [h["seq"] for h in v.hung] == [1, 2] and v.ended_late == 1 and not v.clean


def test_a_target_with_no_outcome_is_lost():
    v = check([record(outcomes={"0": ["ok", None]})], {}, BOUND)
    assert v.lost == [("c0", 1, "apply", 1)] and not v.clean


def test_an_error_that_does_not_name_its_engine_is_caught():
    v = check([record(outcomes={"0": ["ok", None], "1": ["error", "something went wrong"]})], {}, BOUND)
    assert v.unnamed and not v.clean


def test_a_token_logged_twice_on_one_engine_ran_twice():
    v = check([record()], {"7-e.log": ["c0:1", "c0:1"], "8-e.log": ["c0:1"]}, BOUND)
    assert v.twice == [("7-e.log", "c0:1", 2)] and not v.clean


def test_a_result_that_is_not_the_calls_own_is_wrong():
    rec = record()
    rec["wrong"] = [[1, "'c1:5'"]]
    v = check([rec], {}, BOUND)
    assert v.wrong == [("c0", 1, "apply", "coalescing", 2, 1, "'c1:5'")] and not v.clean


def test_refused_calls_and_missing_outputs_are_counted_apart():
    refused = record(2, send_error="IndexError: Engine 3 is not registered")
    out = record(3, op="execute")
    out["output_missing"] = [0]
    v = check([record(1), refused, out], {}, BOUND)
    assert v.clean and v.calls == 2 and v.send_errors == {"IndexError": 1} and v.output_missing == [("c0", 3, 0)]


@pytest.mark.parametrize(
    "text, cause",
    [
        ("Engine 3 died before replying", "died"),
        ("Engine 3 is gone (it died or unregistered): request x did not reach it", "died"),
        ("Host relay h1 has not answered for 3 s; engine 3 did not answer", "unreachable"),
        ("Host relay h1 is down (its link is closed); engine 3 did not answer", "unreachable"),
        ("Relay node 0 restarted; engine 3 did not answer", "restarted"),
        ("Engine 3 did not get the request's data: 1 of 4 chunks came, then none for 6 s", "data"),
        ("Engine 3 was routed to the wrong subtree", "misrouted"),
    ],
)
def test_causes_are_read_from_the_error_text(text, cause):
    assert cause_of(text) == cause and names_engine(text, 3) and not names_engine(text, 31)


def test_calls_are_counted_by_view_and_a_load_balanced_error_need_name_no_engine():
    why = "EngineError: the controller's task queue died (pid 9): no engine answered"
    records = [
        record(1, view="balanced", targets=(-1,), outcomes={"-1": ["error", why]}),
        record(2, view="directview", outcomes={"0": ["ok", None], "1": ["error", why]}),
        record(3, view="auto", ended=None),
        record(4),
    ]
    v = check(records, {}, BOUND)
    assert v.by_view == {"balanced": {"failed": 1}, "directview": {"failed": 1}, "auto": {"hung": 1}, "tree": {"ok": 1}}
    assert v.unnamed == [("c0", 2, "apply", 1, why)]  # a DirectView call's error must name its engine


def test_a_call_failed_by_a_restart_is_lost_work_and_a_broadcast_may_lose_none():
    """Issue 73: an engine that lived, failed only because the controller restarted."""
    why = "EngineError: the controller died (pid 9) with it in flight, and was restarted: engine 1 did not answer"
    stock = record(1, view="directview", outcomes={"0": ["ok", None], "1": ["error", why]})
    v = check([stock], {}, BOUND)
    assert v.restart_lost == [("c0", 1, "apply", "directview", 1, True)] and v.clean  # counted: IPython Parallel's
    assert v.summary()["restart_lost"] == {"directview": 1}
    v = check([stock, record(2, outcomes={"0": ["ok", None], "1": ["error", why]})], {}, BOUND)
    assert v.broadcasts_restart_lost == [("c0", 2, "apply", "tree", 1, True)] and not v.clean
    node = "Relay node 1 lost the request (it restarted or dropped it); engine 1 did not answer"
    v = check([record(3, outcomes={"0": ["ok", None], "1": ["error", node]})], {}, BOUND)
    assert len(v.restart_lost) == 1 and v.broadcasts_restart_lost == [] and v.clean  # a node's restart: counted
