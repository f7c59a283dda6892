"""A relay node returns freed heap to the OS at most every ``every`` seconds."""

import pytest

from ipyparallel_broadcast.host.trim import HeapTrimmer

pytestmark = pytest.mark.pure


def test_trims_when_due_and_not_before():
    calls = []
    trimmer = HeapTrimmer(every=3600)
    trimmer.trim = calls.append
    trimmer.maybe()
    assert calls == []  # not due for an hour
    trimmer.due = 0  # due now
    trimmer.maybe()
    trimmer.maybe()  # the next is an hour away again
    assert calls == [0] and trimmer.trims == 1


def test_zero_never_trims():
    trimmer = HeapTrimmer(every=0)
    trimmer.trim = pytest.fail
    trimmer.due = 0
    trimmer.maybe()
    assert trimmer.trims == 0


def test_glibc_trim_is_found_on_linux():
    import platform

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("malloc_trim is glibc's")
    assert HeapTrimmer().trim is not None
