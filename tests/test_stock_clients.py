"""Stock ``ipyparallel.Client`` views through our tree: what upstream's own
broadcast tests leave out (they override these tests with ``pass``)."""

import glob
import os
import signal

import ipyparallel as ipp
import pytest
import zmq
from cluster_util import arrive_and_hold, arrived, running_cluster, until
from ipyparallel import error, interactive

pytestmark = pytest.mark.cluster

MODES = pytest.mark.parametrize("coalescing", [True, False], ids=["coalescing", "streaming"])


@pytest.fixture(scope="module")
def stock():
    """A stock client of one of our clusters (3 engines, depth 1)."""
    with running_cluster(3, 1, 2) as rc:
        (url,) = glob.glob(os.path.join(rc.test_profile_dir, "security", "ipcontroller-*client.json"))
        client = ipp.Client(url)
        client._ipb_url = url
        client.wait_for_engines(3, timeout=60)
        try:
            yield client
        finally:
            client.close()


@pytest.fixture(scope="module")
def ours(stock):
    """Our client of the same cluster."""
    import ipyparallel_broadcast as ipb

    rc = ipb.Client(stock._ipb_url)
    rc.wait_for_engines(3, timeout=60)
    try:
        yield rc
    finally:
        rc.close()


@MODES
def test_scatter_tracked(stock, ours, coalescing):
    """``track=True``: our view gives a MessageTracker of the one request it
    sends (upstream's DirectView test); a stock broadcast view's scatter gets
    every part to its engine. (Its AsyncResult never reports ``sent``: it is
    made of its pushes' futures and set by none; ipyparallel's client, not the
    tree: upstream's xfail "Tracking gets disconnected from original message".)"""
    x = "x" * 1024 * 1024
    mine = ours.broadcast_view(coalescing=coalescing)
    ar = mine.scatter("x", x, block=False, track=True)
    assert ar._sent_event.wait(30)
    assert isinstance(ar._tracker, zmq.MessageTracker)
    assert ar.sent == ar._tracker.done
    ar.wait_for_send(30)
    assert ar.sent
    ar.get(timeout=30)
    view = stock.broadcast_view(is_coalescing=coalescing)
    view.apply_sync(forget_x)
    view.scatter("x", x, block=False, track=True).get(timeout=30)
    assert "".join(view.apply_sync(get_x)) == x


@interactive
def forget_x():
    globals().pop("x", None)


@interactive
def get_x():
    return x  # noqa: F821 (the engines' x)


def test_apply_displaypub_in_order(stock):
    """Streaming: each engine's display outputs arrive, in the order it
    displayed them. (Coalescing: a stock AsyncResult has one message id for
    every engine and loses some engines' outputs; see the README.)"""
    view = stock.broadcast_view(is_coalescing=False)
    view.execute("from IPython.display import display", block=True)

    @interactive
    def publish():
        [display(i) for i in range(5)]  # noqa: F821

    ar = view.apply_async(publish)
    ar.get(timeout=30)
    assert ar.wait_for_output(30)
    expected = [{"text/plain": str(j)} for j in range(5)]
    assert [[out["data"] for out in outputs] for outputs in ar.outputs] == [expected] * 3


def test_an_engine_killed_mid_call(tmp_path):
    """Streaming: the survivors' results and an EngineError for the dead
    engine. Coalescing: a stock AsyncResult holds one result for all engines,
    so the call fails as a whole with the EngineError (see the README); no
    hang either way, and the survivors serve on."""
    with running_cluster(3, 1, 2) as rc:
        (url,) = glob.glob(os.path.join(rc.test_profile_dir, "security", "ipcontroller-*client.json"))
        stock = ipp.Client(url)
        try:
            stock.wait_for_engines(3, timeout=60)
            for coalescing in (False, True):
                view = stock.broadcast_view(is_coalescing=coalescing)
                pids = view.apply_sync(os.getpid)
                folder = tmp_path / str(coalescing)
                folder.mkdir()
                ar = view.apply_async(arrive_and_hold, str(folder))
                until(
                    lambda folder=folder, pids=pids: arrived(folder) == sorted(pids),
                    what="every engine to run the call",
                )
                victim = stock.ids[0]
                os.kill(pids[0], signal.SIGKILL)
                (folder / "go").touch()
                if coalescing:
                    with pytest.raises(error.RemoteError) as info:
                        ar.get(timeout=60)
                    assert info.value.ename == "EngineError"
                    assert f"Engine {victim!r} died" in str(info.value.evalue)
                else:
                    results = ar.get(timeout=60, return_exceptions=True)
                    assert isinstance(results[0], error.RemoteError) and results[0].ename == "EngineError"
                    assert results[1:] == pids[1:]
                until(lambda pids=pids: len(stock.ids) == len(pids) - 1, what="the hub to drop the killed engine")
                assert stock.broadcast_view(is_coalescing=coalescing).apply_sync(os.getpid) == pids[1:]
        finally:
            stock.close()


def test_one_line_takes_a_notebooks_stock_client_to_ours(stock):
    """``rc = ipb.Client(rc)``: a stock client's ``broadcast_view()`` is IPython
    Parallel's own (no ``reduce``; ``coalescing=`` is a KeyError); ours from it
    reaches the same engines, and the stock one still works."""
    import ipyparallel_broadcast as ipb

    assert not hasattr(stock.broadcast_view(), "reduce")
    rc = ipb.Client(stock)
    try:
        rc.wait_for_engines(3, timeout=60)
        assert rc.ids == stock.ids
        view = rc.broadcast_view(coalescing=False)
        assert view.apply_sync(lambda: 2) == [2, 2, 2]
        assert rc.broadcast_view().reduce(lambda: 2, op="sum", block=True) == 6
        assert stock[:].apply_sync(lambda: 1) == [1, 1, 1]
    finally:
        rc.close()
