"""ipyparallel's DirectView test module on our engines (outputs in the reply),
with our BroadcastView substituted, in the three reply modes."""

from ipyparallel.tests import test_view as upstream
from substitute import on_our_engines, substituted

cluster = on_our_engines()
substituted(upstream.TestView, globals())
