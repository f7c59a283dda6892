"""Grouping by equality, without a cluster: engine ranges, groups in order of
first appearance, ``Outputs`` and ``GroupedCompositeError``'s text."""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from ipyparallel import error

from ipyparallel_broadcast.client.display import grouping as G

pytestmark = pytest.mark.pure


def parse_ranges(text):
    out = set()
    for part in text.split(","):
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out


def test_engine_ranges_join_runs():
    assert G.engine_ranges([3, 0, 1, 2, 7, 9, 10]) == "0-3,7,9-10"
    assert G.engine_ranges([5]) == "5"
    assert G.engine_ranges(range(511)) == "0-510"


@given(st.sets(st.integers(0, 2000), min_size=1))
def test_engine_ranges_name_exactly_their_engines(eids):
    text = G.engine_ranges(eids)
    assert parse_ranges(text) == eids
    assert text.count(",") < len(eids)


@given(st.lists(st.sampled_from("abcd"), max_size=50))
def test_groups_come_in_order_of_first_appearance_and_cover_every_engine(keys):
    eids = list(range(100, 100 + len(keys)))
    found = G.groups(keys, eids)
    assert [k for k, _ in found] == list(dict.fromkeys(keys))
    assert sorted(e for _, es in found for e in es) == eids
    for key, es in found:
        assert all(keys[e - 100] == key for e in es)


def test_labels_keep_ipyparallels_form_for_one_engine():
    assert G.label("stdout", [7]) == "[stdout:7]"
    assert G.label("stdout", list(range(511))) == "[stdout:0-510 (511 engines)]"


def test_outputs_are_the_list_and_group_only_above_the_threshold():
    few = G.Outputs(["a\n"] * G.GROUP_ABOVE, range(G.GROUP_ABOVE))
    assert few == ["a\n"] * G.GROUP_ABOVE and repr(few) == repr(["a\n"] * G.GROUP_ABOVE)
    texts = ["done\n"] * 511 + ["other\n"]
    many = G.Outputs(texts, range(512))
    assert many == texts and many[511] == "other\n"
    assert repr(many).splitlines()[1:] == [" [stdout:0-510 (511 engines)]: 'done\\n'", " [stdout:511]: 'other\\n'>"]
    page = many._repr_html_()
    assert page.count("<details") == 2 and "[stdout:0-510 (511 engines)]" in page


def elist(evalues, tb="Traceback ...\nZeroDivisionError: division by zero"):
    return [("ZeroDivisionError", ev, tb, dict(engine_id=i, method="apply")) for i, ev in enumerate(evalues)]


def test_one_error_on_every_engine_renders_one_traceback():
    e = G.GroupedCompositeError("one or more exceptions raised in: apply", elist(["division by zero"] * 512))
    assert isinstance(e, error.CompositeError) and len(e.elist) == 512
    assert str(e).splitlines()[1:] == ["[0-511:apply] (512 engines) ZeroDivisionError: division by zero"]
    lines = e.render_traceback()
    assert lines.count("[0-511:apply] (512 engines):") == 1
    assert sum("ZeroDivisionError: division by zero" == line for line in lines) == 1
    assert e.render_traceback(7)[0] == "[7:apply]:"  # one engine's, as ipyparallel's


def test_distinct_errors_in_order_of_first_appearance_up_to_the_limit():
    evalues = [f"bad {i % 6}" for i in range(60)]
    e = G.GroupedCompositeError("m", elist(evalues, tb=None))
    heads = str(e).splitlines()[1:]
    assert heads[:4] == [
        f"[{G.engine_ranges(range(k, 60, 6))}:apply] (10 engines) ZeroDivisionError: bad {k}" for k in range(4)
    ]
    assert (
        heads[4]
        == f"... 2 more distinct errors, on engines {G.engine_ranges(set(range(4, 60, 6)) | set(range(5, 60, 6)))} ..."
    )
    assert "ZeroDivisionError: bad 3" in e.render_traceback()


def test_few_engines_keep_ipyparallels_message():
    pairs = elist(["x"] * G.GROUP_ABOVE)
    assert str(G.GroupedCompositeError("m", pairs)) == str(error.CompositeError("m", pairs))
    assert G.GroupedCompositeError("m", pairs).render_traceback() == error.CompositeError("m", pairs).render_traceback()


def test_of_keeps_what_the_original_carried():
    original = error.CompositeError("m", elist(["x"] * 3))
    original.results = [1, 2, 3]
    e = G.GroupedCompositeError.of(original)
    assert e.results == [1, 2, 3] and e.elist == original.elist and e.msg == "m"
