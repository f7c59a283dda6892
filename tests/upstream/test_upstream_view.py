"""ipyparallel's DirectView test module with our BroadcastView substituted,
in the coalescing, streaming and partial-coalescing reply modes."""

from ipyparallel.tests import test_view as upstream
from substitute import substituted

substituted(upstream.TestView, globals())
