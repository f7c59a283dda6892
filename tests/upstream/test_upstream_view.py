"""ipyparallel's DirectView test module with our BroadcastView substituted, on
stock engines, in the coalescing mode. The streaming and partial-coalescing
modes are the relay tree's and our client's, the same whatever the engine:
``test_upstream_view_our_engines.py`` runs all three."""

from ipyparallel.tests import test_view as upstream
from substitute import substituted

substituted(upstream.TestView, globals(), modes=["Coalescing"])
