"""Run an upstream ``ClusterTestCase`` with our BroadcastView for every view.

Mixed in before an ipyparallel test class: its client is an
``ipyparallel_broadcast.Client`` and every view it makes (``client[...]``,
``client.direct_view``, int targets included) is a ``BroadcastView`` with the
class's ``coalescing`` mode. Nothing of the upstream tests is copied.
``on_our_engines()`` makes a module's cluster start our engines.
"""

import sys
import time
from unittest import mock

import ipyparallel as ipp
import ipyparallel.tests as ipp_tests
import pytest

import ipyparallel_broadcast as ipb

MODES = {
    "Coalescing": True,
    "Streaming": False,
    "Partial": ipb.Batch(count=2, interval=0.05),
}


class BroadcastSubstitution:
    coalescing = True

    def connect_client(self):
        client = ipb.Client(profile="iptest", context=self.context)
        client.wait = lambda *a, **kw: self.client_wait(client, *a, **kw)
        return client

    def setup_method(self):
        settle_engines()
        super().setup_method()
        coalescing = self.coalescing

        def direct_view(targets="all", **kwargs):
            return self.client.broadcast_view(targets, coalescing=coalescing, **kwargs)

        self.client.direct_view = direct_view
        assert isinstance(self.client[:], ipb.BroadcastView)
        assert isinstance(self.client[-1], ipb.BroadcastView)

    def teardown_method(self):
        settle_engines(self.client)  # upstream's teardown broadcasts to client[:]
        super().teardown_method()


def substituted(upstream_class, namespace, modes=tuple(MODES)):
    """Define ``Test<Name><Mode>`` in ``namespace`` for each of ``modes``."""
    base = upstream_class.__name__.removeprefix("Test")
    for mode in modes:
        coalescing = MODES[mode]
        name = f"Test{base}{mode}"
        namespace[name] = type(name, (BroadcastSubstitution, upstream_class), {"coalescing": coalescing})


def on_our_engines():
    """A module's ``cluster`` fixture: upstream's cluster, with our engines
    (``ipyparallel_broadcast.engine``) for every engine it starts."""

    @pytest.fixture(scope="module")
    def cluster(ipython_dir):
        ours = [sys.executable, "-m", "ipyparallel_broadcast.engine"]
        with mock.patch.object(ipp_tests, "ipengine_cmd_argv", ours):
            ipp_tests.setup()
            try:
                rc = ipp.Client(profile="iptest")
                rc[:].execute("_ipb_kernel = type(get_ipython().kernel).__module__", block=True)
                kinds = rc[:].pull("_ipb_kernel", block=True)
                rc.close()
                assert kinds == ["ipyparallel_broadcast.engine.kernel"], kinds
                yield
            finally:
                ipp_tests.teardown()

    return cluster


def settle_engines(*clients, timeout=20):
    """Wait until every registered engine has answered a call, or is
    unregistered (also in ``clients``) if it died.

    Upstream's setup counts registered engines to decide how many to start, and
    its teardown broadcasts to ``client[:]``: right after a test SIGKILLs
    engines, dead ones may still be registered, and either step races with
    their unregistration. A live engine still busy with a test's call answers
    when that call ends; no fixed wait either way.
    """
    rc = ipp.Client(profile="iptest")
    try:
        ids = rc.ids
        if not ids:
            return
        ar = rc[ids].apply_async(int)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            unsettled = {
                eid
                for eid, child in zip(ids, ar._children)
                if not child.done() or isinstance(child.exception() or child.result(), Exception)
            }
            registered = [{k for k in rc.queue_status() if isinstance(k, int)}]  # the hub's own list:
            registered += [set(c.ids) for c in clients]  # rc's may miss an unregistration at its start
            if not any(unsettled & ids for ids in registered):
                return
            time.sleep(0.1)
        raise TimeoutError(f"engines {sorted(unsettled)} neither answered nor unregistered in {timeout} s")
    finally:
        rc.close()
