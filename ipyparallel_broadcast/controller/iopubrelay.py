"""The controller's IOPub relay: every engine's outputs to every client, as
ipyparallel's monitored queue relays them, and a *hello* to each client that
asks, so that a client knows when its subscription is live.

ZeroMQ's PUB socket drops what it publishes before a subscriber's
subscription has reached it (the "slow joiner"). A client that sends its first
request as soon as it connects can lose that request's first outputs, and
``wait_for_output()`` then waits for them forever (ipyparallel does the same;
see ``docs/iopub.md``). Here the client side of the relay is an XPUB socket,
which hands the relay every subscription as it takes it in. A client
subscribes to everything (``b""``) and then to ``HELLO_PREFIX + its session``;
when the second one reaches the relay, the first already has (a subscriber's
subscriptions arrive in order), and the relay publishes a signed
``iopub_welcome`` message on that topic. The client sends nothing before it
has it (``client.Client``). Other clients get the hello too and drop it, as
IPython Parallel's own clients drop any IOPub message without a parent.

The engines' side and the hub's monitor are as ipyparallel has them: a SUB
bound for the engines, subscribed to everything, and a copy of each output,
prefixed ``b"iopub"``, to the hub's monitor (not of a message with no topic:
the hub cannot file it).
"""

from __future__ import annotations

import logging

import zmq
from jupyter_client.session import Session

from ..wire.naming import IOPUB_HELLO_PREFIX
from .queues import monitor_socket, run_relay, server_socket

log = logging.getLogger(__name__)
HELLO_PREFIX = IOPUB_HELLO_PREFIX
DELIM = b"<IDS|MSG>"
WELCOME = "iopub_welcome"
CLIENT_BACKLOG = 100_000  # outputs queued for one client that is behind, before any is dropped
DRAIN = 256  # outputs relayed per wake-up at most, before the subscriptions are looked at


class Hellos:
    """Sans-I/O: a subscription frame in, the frames of its hello out (or None)."""

    def __init__(self, session: Session):
        self.session = session
        self.sent = 0

    def answer(self, frame: bytes) -> list[bytes] | None:
        if not (frame[:1] == b"\x01" and frame[1:].startswith(HELLO_PREFIX)):
            return None  # another subscription, or an unsubscription
        topic = frame[1:]
        self.sent += 1
        msg = self.session.msg(WELCOME, content=dict(topic=topic.decode("utf8", "replace")))
        return self.session.serialize(msg, ident=topic)


class IOPubRelay:
    """The relay's sockets: a SUB bound for the engines, an XPUB bound for the
    clients, a PUB to the hub's monitor; ``once()`` is one wake-up."""

    def __init__(self, ctx: zmq.Context, spec: dict):
        self.sub, self.xpub = server_socket(ctx, zmq.SUB, spec), server_socket(ctx, zmq.XPUB, spec)
        self.xpub.setsockopt(zmq.XPUB_VERBOSE, 1)  # every hello subscription, even a repeated topic
        # ZeroMQ drops what a subscriber is too far behind to take (1000 messages
        # by default, ipyparallel's too): a busy client lost an output that way in
        # the chaos soak. Far more is kept now, bounded, for a client that stops reading
        self.xpub.SNDHWM = CLIENT_BACKLOG
        self.sub.RCVHWM = 0
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.bind(spec["engine_url"])
        self.xpub.bind(spec["client_url"])
        self.monitor = monitor_socket(ctx, spec)
        self.poller = zmq.Poller()
        self.poller.register(self.sub, zmq.POLLIN)
        self.poller.register(self.xpub, zmq.POLLIN)
        session = Session(
            key=spec["key"].encode(),
            signature_scheme=spec["signature_scheme"],
            packer=spec["packer"],
            unpacker=spec["unpacker"],
        )
        self.hellos = Hellos(session)

    def once(self, timeout=None) -> int:
        """Outputs in from the engines go out to clients and the monitor;
        subscriptions get their hellos. Returns how many outputs were relayed."""
        events = dict(self.poller.poll(timeout))
        relayed = 0
        if self.sub in events:
            while relayed < DRAIN:
                try:
                    msg = self.sub.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                self.xpub.send_multipart(msg, copy=False)
                # the hub files outputs by topic; a kernel's own iopub_welcome
                # (ipykernel 7) has none, and the hub logged an error for each
                if self.monitor is not None and msg[0].bytes != DELIM:
                    self.monitor.send_multipart([b"iopub", *msg], copy=False)
                relayed += 1
        if self.xpub in events:
            while True:
                try:
                    frame = self.xpub.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                hello = self.hellos.answer(frame)
                if hello is not None:
                    self.xpub.send_multipart(hello)
        return relayed


def run_iopub_relay(spec: dict, in_process: bool = True):
    """Entry point: the IOPub relay, until terminated."""
    run_relay(IOPubRelay, spec, in_process, "IOPub relay")
