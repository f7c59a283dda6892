"""ipyparallel's ``test_view_broadcast.py``, both classes, against our tree.

The stock ``ipyparallel.Client().broadcast_view(is_coalescing=...)`` talks to
our controller unchanged. The module deletes its non-coalescing class at the
end (``# FIXME``); it is the coalescing class's base, so we re-enable it here.
"""

from ipyparallel.tests.test_view_broadcast import TestBroadcastViewCoalescing

TestBroadcastView = TestBroadcastViewCoalescing.__mro__[1]
assert TestBroadcastView.__name__ == "TestBroadcastView"
assert TestBroadcastView.is_coalescing is False

__all__ = ["TestBroadcastView", "TestBroadcastViewCoalescing"]
