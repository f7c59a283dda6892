"""ipyparallel's DirectView test module with our BroadcastView substituted.

Every view a ``TestView`` test makes (``client[...]``, ``client.direct_view``,
int targets included) is an ``ipyparallel_broadcast.BroadcastView``, once per
reply mode: coalescing, streaming and partial coalescing. The client is an
``ipyparallel_broadcast.Client`` on our controller (see ``conftest.py``).
"""

import pytest
from ipyparallel.tests import test_view as upstream

import ipyparallel_broadcast as ipb


class _Substituted(upstream.TestView):
    coalescing = True

    def connect_client(self):
        client = ipb.Client(profile="iptest", context=self.context)
        client.wait = lambda *a, **kw: self.client_wait(client, *a, **kw)
        return client

    def setup_method(self):
        super().setup_method()
        coalescing = self.coalescing

        def direct_view(targets="all", **kwargs):
            return self.client.broadcast_view(targets, coalescing=coalescing, **kwargs)

        self.client.direct_view = direct_view
        assert isinstance(self.client[:], ipb.BroadcastView)
        assert isinstance(self.client[-1], ipb.BroadcastView)


class TestViewCoalescing(_Substituted):
    coalescing = True


class TestViewStreaming(_Substituted):
    coalescing = False


class TestViewPartial(_Substituted):
    coalescing = ipb.Batch(count=2, interval=0.05)
