"""ipyparallel's magics tests (%px, %%px, %autopx, %pxresult) with our
BroadcastView substituted, in the three reply modes."""

from ipyparallel.tests import test_magics as upstream
from substitute import substituted

substituted(upstream.TestParallelMagics, globals())
