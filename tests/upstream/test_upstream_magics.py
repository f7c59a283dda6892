"""ipyparallel's magics tests (%px, %%px, %autopx, %pxresult) with our
BroadcastView substituted, on stock engines, in the coalescing mode (the
three reply modes: ``test_upstream_magics_our_engines.py``)."""

from ipyparallel.tests import test_magics as upstream
from substitute import substituted

substituted(upstream.TestParallelMagics, globals(), modes=["Coalescing"])
