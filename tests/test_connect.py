"""A client that connects while the controller restarts (``client.connect``),
on real zmq sockets without a cluster: the request goes to a controller that
dies with it, and a restarted controller beats before the client's first try
has timed out. The client asks again, of the controller it first heard after
its request went (it waited out its whole timeout: the full suite found it, in
``test_controller_restart``, when the controller came back within a second)."""

import time

import pytest
import zmq
from jupyter_client.session import Session

from ipyparallel_broadcast.client import connect
from ipyparallel_broadcast.controller.notices import Notices

pytestmark = pytest.mark.cluster


@pytest.fixture
def beats():
    """A controller's beats on a PUB of its own, every 50 ms; (url, session, notices)."""
    session = Session(key=b"secret")
    bound = {}

    def bind(sock, url):
        sock.bind(url)
        bound["url"] = sock.LAST_ENDPOINT.decode()

    notices = Notices(session, "tcp://127.0.0.1:*", bind, interval=0.05)
    notices.start()
    deadline = time.monotonic() + 10
    while "url" not in bound and time.monotonic() < deadline:
        notices.thread.join(0.01)
    assert "url" in bound, "the notices socket was not bound"
    yield bound["url"], session, notices
    notices.stop()
    notices.thread.join(5)


@pytest.fixture
def link(beats):
    """A client's query socket and its watch on the controller's beats; (query, watch)."""
    url, session, _ = beats
    ctx = zmq.Context.instance()
    query = ctx.socket(zmq.DEALER)
    query.linger = 0
    watch = connect.BeatWatch(ctx, url, session, {})
    yield query, watch
    watch.close()
    query.close()


def connect_with(link, monkeypatch, slice_, timeout, answer, tries):
    """``connect_patiently`` over ``link``, tries of ``slice_`` s at first;
    try n's outcome is ``answer(n, seconds)``; each try's seconds go in ``tries``."""
    query, watch = link
    monkeypatch.setattr(connect, "SLICE", slice_)

    def try_once(seconds):
        tries.append(seconds)
        return answer(len(tries), seconds)

    return connect.connect_patiently(try_once, query, watch, timeout=timeout, reset=lambda: None)


def test_a_controller_first_heard_during_the_first_try_is_asked_again(link, monkeypatch):
    watch, tries = link[1], []

    def answer(n, seconds):
        if n == 1:  # the request went to a controller that died with it; the new one beats meanwhile
            assert watch.sock.poll(10_000), "no beat came"  # (ms)
            raise TimeoutError("no reply")
        return "connected"

    assert connect_with(link, monkeypatch, 0.5, 20, answer, tries) == "connected"
    assert len(tries) == 2


def test_a_controller_that_beats_and_does_not_answer_is_asked_once_more_then_waited_for(link, monkeypatch):
    tries = []

    def answer(n, seconds):
        time.sleep(seconds)
        raise TimeoutError("no reply")

    with pytest.raises(TimeoutError):
        connect_with(link, monkeypatch, 0.2, 2, answer, tries)
    assert len(tries) == 2  # once, and once more of the controller first heard meanwhile; then its reply waited for
