"""ipyparallel's Client test module on our engines, with our BroadcastView
substituted (one reply mode, as on stock engines)."""

from ipyparallel.tests import test_client as upstream
from substitute import on_our_engines, substituted

cluster = on_our_engines()
substituted(upstream.TestClient, globals(), modes=["Coalescing"])
