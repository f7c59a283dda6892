"""The client's broadcast socket read by a loop of its own (``RootSocket``),
on real zmq sockets and a real tornado loop in a thread: every message read,
in order, several per wakeup; sends that meet a full queue wait and go in
order; a send never strands a message that came meanwhile; a handler that
raises stops nothing. (The client on a live cluster: every broadcast test.)"""

import select
import threading
import time

import pytest
import zmq
from tornado.ioloop import IOLoop

from ipyparallel_broadcast.client.rootsocket import DRAIN, RootSocket

pytestmark = pytest.mark.cluster  # real sockets and a thread, no cluster

WAIT = 30  # seconds: a bound on events, never a sleep


class Loop:
    """A tornado loop in its own thread, a ROUTER peer bound on inproc, and a
    ``RootSocket`` over a DEALER connected to it."""

    def __init__(self, hwm=None):
        self.ctx = zmq.Context()
        self.peer = self.ctx.socket(zmq.ROUTER)
        if hwm is not None:
            self.peer.rcvhwm = hwm  # (inproc's queue holds the two marks together)
        self.peer.bind("inproc://root")
        dealer = self.ctx.socket(zmq.DEALER)
        if hwm is not None:
            dealer.sndhwm = hwm
        dealer.connect("inproc://root")
        self.dealer = dealer
        self.got, self.done = [], threading.Event()
        self.expect = None
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self.thread.start()
        assert ready.wait(WAIT)

    def _run(self, ready):
        self.loop = IOLoop()
        self.root = RootSocket(self.dealer, self.loop)
        ready.set()
        self.loop.start()

    def call(self, fn, *args):
        """Run ``fn(*args)`` on the loop's thread and wait for it."""
        finished = threading.Event()

        def run():
            try:
                fn(*args)
            finally:
                finished.set()

        self.loop.add_callback(run)
        assert finished.wait(WAIT)

    def read(self, frames):
        self.got.append(b"".join(bytes(f.buffer) for f in frames))
        if self.expect is not None and len(self.got) >= self.expect:
            self.done.set()

    def peer_identity(self):
        """The DEALER's identity at the ROUTER (from one hello)."""
        self.call(self.root.send_multipart, [b"hello"])
        ident, _ = self.peer.recv_multipart()
        return ident

    def close(self):
        self.loop.add_callback(self.loop.stop)
        self.thread.join(WAIT)
        self.root.close(linger=0)
        self.peer.close(linger=0)
        self.ctx.term()


@pytest.fixture
def loop():
    lp = Loop()
    yield lp
    lp.close()


def test_messages_waiting_are_read_in_order_several_per_wakeup(loop):
    ident = loop.peer_identity()
    n = 3 * DRAIN + 7
    for i in range(n):  # all waiting before the handler is registered
        loop.peer.send_multipart([ident, b"m%d" % i])
    loop.expect = n
    loop.call(loop.root.on_recv, loop.read)
    assert loop.done.wait(WAIT), f"read {len(loop.got)} of {n}"
    assert loop.got == [b"m%d" % i for i in range(n)]
    assert loop.root.received == n
    # one wakeup per DRAIN messages or so, not one per message
    assert loop.root.wakeups <= n // DRAIN + 8, loop.root.wakeups


def test_ping_pong_never_strands_a_reply(loop):
    """Each reply arrives as the next request goes out: a send that took the
    descriptor's wakeup would leave that reply unread and the exchange stuck."""
    ident = loop.peer_identity()
    rounds = 300
    loop.expect = rounds

    def reply_then_send(frames):
        loop.read(frames)
        if len(loop.got) < rounds:
            loop.root.send_multipart([b"q%d" % len(loop.got)])

    loop.call(loop.root.on_recv, reply_then_send)

    def peer():
        for _ in range(rounds):
            if not loop.peer.poll(WAIT * 1000):
                return
            who, body = loop.peer.recv_multipart()
            loop.peer.send_multipart([who, b"r" + body])

    answering = threading.Thread(target=peer, daemon=True)
    answering.start()
    loop.call(loop.root.send_multipart, [b"q0"])
    assert loop.done.wait(WAIT), f"stuck after {len(loop.got)} of {rounds} replies"
    answering.join(WAIT)
    assert loop.got == [b"rq%d" % i for i in range(rounds)]
    assert ident


def past_throttle():
    """Let libzmq's command throttle lapse: a send reads the socket's commands
    (and so takes the descriptor's wakeup) only if 3,000,000 TSC cycles have
    passed since it last did (``max_command_delay``: 3 ms at 1 GHz, or more).
    Not a wait for an event: the condition the test needs."""
    end = time.perf_counter() + 0.004
    while time.perf_counter() < end:
        pass


def test_a_send_that_takes_the_wakeup_of_a_message_leaves_it_readable(loop):
    """A message arrives, zmq's descriptor fires, and before the loop looks, a
    send on the same socket takes that wakeup (zmq reads its commands): the
    loop would never be woken for the message."""
    ident = loop.peer_identity()
    loop.expect = 1
    loop.call(loop.root.on_recv, loop.read)
    fd = loop.dealer.getsockopt(zmq.FD)

    def arrive_then_send():  # on the loop's thread: the loop cannot look in between
        loop.peer.send_multipart([ident, b"arrived"])
        assert select.select([fd], [], [], WAIT)[0], "the message's wakeup never came"
        past_throttle()
        loop.root.send_multipart([b"a send"])

    loop.call(arrive_then_send)
    assert loop.done.wait(WAIT), "the message that came before the send was never read"
    assert loop.got == [b"arrived"]


def test_sends_past_the_high_water_mark_wait_and_go_in_order():
    lp = Loop(hwm=2)
    try:
        sent = []
        lp.call(lp.root.on_send, lambda frames, tracker: sent.append(frames[0]))
        lp.peer_identity()
        n = 500

        def send_all():
            for i in range(n):
                lp.root.send_multipart([b"s%d" % i])

        lp.call(send_all)  # the peer is not reading: most must wait, none may be dropped
        assert len(sent) < n / 2
        got = [lp.peer.recv_multipart()[1] for _ in range(n) if lp.peer.poll(WAIT * 1000)]
        assert got == [b"s%d" % i for i in range(n)]
        lp.call(lambda: None)  # the loop has run past the last send's callback
        assert sent == [b"hello"] + got
    finally:
        lp.close()


def test_a_handler_that_raises_stops_nothing(loop, caplog):
    ident = loop.peer_identity()
    loop.expect = 3

    def fails_on_bad(frames):
        if bytes(frames[0].buffer) == b"bad":
            raise ValueError("a bad message")
        loop.read(frames)

    loop.call(loop.root.on_recv, fails_on_bad)
    for body in (b"one", b"bad", b"two", b"three"):
        loop.peer.send_multipart([ident, body])
    assert loop.done.wait(WAIT), loop.got
    assert loop.got == [b"one", b"two", b"three"]
    assert "handler failed" in caplog.text and "a bad message" in caplog.text


def test_a_tracked_send_hands_its_tracker_to_the_callback(loop):
    trackers = []
    loop.call(loop.root.on_send, lambda frames, tracker: trackers.append(tracker))
    loop.call(loop.root.send_multipart, [b"x" * 100_000], False, True)
    loop.call(loop.root.send_multipart, [b"y"])
    assert isinstance(trackers[0], zmq.MessageTracker)
    assert trackers[1] is None
    assert loop.peer.recv_multipart()[1] == b"x" * 100_000
    trackers[0].wait(WAIT)
    assert trackers[0].done


def test_reading_without_copy_only():
    lp = Loop()
    try:
        with pytest.raises(ValueError, match="without copying"):
            lp.root.on_recv(lp.read, copy=True)
    finally:
        lp.close()
