"""A relay node returns freed heap to the OS at most every ``every`` seconds,
and once more after the last message."""

import pytest

from ipyparallel_broadcast.host.trim import HeapTrimmer

pytestmark = pytest.mark.pure


def fake(every):
    calls = []
    trimmer = HeapTrimmer(every=every)
    trimmer.trim, trimmer.on = calls.append, bool(every)
    return trimmer, calls


def test_trims_when_owed_and_due_and_not_before():
    trimmer, calls = fake(3600)
    trimmer.due = 0
    trimmer.maybe()
    assert calls == [] and trimmer.next_due() is None  # no message came: nothing owed
    trimmer.owe()
    due = trimmer.next_due()
    trimmer.maybe()
    assert calls == [] and due > 3000  # owed, but an hour away
    trimmer.owe()
    assert trimmer.next_due() == due  # more messages do not put it off
    trimmer.due = 0  # due now
    trimmer.maybe()
    trimmer.maybe()  # made: nothing owed until messages come again
    assert calls == [0] and trimmer.trims == 1 and trimmer.next_due() is None


def test_zero_never_trims():
    trimmer, _ = fake(0)
    trimmer.trim = pytest.fail
    trimmer.owe()
    trimmer.due = 0
    trimmer.maybe()
    assert trimmer.trims == 0 and trimmer.next_due() is None


def test_glibc_trim_is_found_on_linux():
    import platform

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("malloc_trim is glibc's")
    assert HeapTrimmer().trim is not None
