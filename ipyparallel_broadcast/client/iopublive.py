"""A client sends nothing before its IOPub subscription is live.

ZeroMQ drops what a PUB socket publishes before a new subscriber's
subscription has reached it, so a client that sends a request as soon as it
connects could lose that request's first outputs for good (the "slow joiner";
``docs/iopub.md``). The client waits, when it connects, for proof that its
subscription is live: any message on IOPub (a PUB sends only to subscribers it
knows). On our controller a hello comes for sure (``iopubrelay``); on a stock
one the client asks one engine for its ``kernel_info`` on the control channel,
and the engine's ``status`` on IOPub is the proof.

Output can still fail to come for other reasons (its engine died, a message
was lost): ``wait_for_output()`` and ``%px`` then end anyway. An engine whose
reply is in but whose output has not ended (no ``idle`` status) for
``output_timeout`` seconds has its output closed, with a line naming the
engine and the cause appended to its stderr, and a warning logged.
"""

from __future__ import annotations

import logging
import threading
import time
from functools import partial

import zmq
from tornado.ioloop import PeriodicCallback

from ..wire.naming import IOPUB_HELLO_PREFIX as HELLO_PREFIX
from ..wire.naming import TREE_KEY
from .guard import guarded_callback
from .results import outcome_metadata

log = logging.getLogger(__name__)


class IOPubLiveness:
    """A part of our Client: the wait for a live IOPub subscription at
    connect, and outputs owed too long closed. It owns that state; ``client``
    is the Client it serves (its sockets, loop, calls and ipyparallel's tables)."""

    def __init__(self, client):
        self.client = client
        self.live = threading.Event()  # before the I/O thread can deliver
        self.owed: dict[tuple, float] = {}  # (msg_id, index) -> when first seen owed
        self.waited: float | None = None  # seconds the connect waited for it

    def wait(self):
        """Once connected: proof that the subscription is live, or ``iopub_timeout``."""
        client, tic = self.client, time.perf_counter()
        timeout, ours = client.iopub_timeout, TREE_KEY in client._connection_info
        if not self.live.is_set() and not ours:
            self._probe()
        waited = timeout > 0 and self.live.wait(timeout)
        if timeout > 0 and not waited and (ours or client.ids):
            log.warning(
                "No sign within %.0f s that this client's IOPub subscription is live: "
                "outputs of its first requests may be lost",
                timeout,
            )
        self.waited = time.perf_counter() - tic

    # ------------------------------------------------------ overdue outputs
    def owed_outputs(self):
        """``(key, close)`` for each reply that is in while its output is not:
        broadcast engines and ipyparallel's own requests (I/O thread)."""
        client = self.client
        for call in list(client._calls.live.values()):
            if call.left or not call.iopub:
                continue
            for i, o in enumerate(call.outcomes):
                if o is not None and o[0] == "reply" and o[2]:
                    yield (call.msg_id, i), partial(self._close_broadcast_output, call, i)
        futures = client._reply_futures
        for msg_id, output in list(client._iopub_futures.items()):
            reply = futures.get(msg_id)
            if not output.done() and reply is not None and reply.done() and not client._calls.of_vid(msg_id)[0]:
                yield (msg_id, None), partial(self._close_output, msg_id, output)

    def close_owed(self, why: str):
        """Every output owed now ends, with ``why`` (its IOPub relay died)."""
        for _, close in list(self.owed_outputs()):
            close(why)

    def check(self):
        """Close outputs owed longer than ``output_timeout`` (a periodic tick)."""
        now, seen, owed = time.monotonic(), self.owed, {}
        for key, close in self.owed_outputs():
            first = owed[key] = seen.get(key, now)
            if now - first >= self.client.output_timeout:
                del owed[key]
                close(
                    f"its reply came {now - first:.0f} s ago or more, and the end of its output "
                    "(its 'idle' status on IOPub) did not"
                )
        self.owed = owed

    @staticmethod
    def _note_missing(md, eid, msg_id, why):
        note = f"[ipyparallel_broadcast] output from engine {eid} may be incomplete: {why}\n"
        md["stderr"] = (md.get("stderr") or "") + note
        log.warning("Output of %s from engine %s did not all come: %s", msg_id, eid, why)

    def _close_broadcast_output(self, call, i, why):
        self._note_missing(outcome_metadata(self.client, call, i), call.eids[i], call.vids[i], why)
        self.client._replies.output_done(call, i)

    def _close_output(self, msg_id, output, why):
        client = self.client
        md = client.metadata[msg_id]
        result = client._reply_futures[msg_id].result()
        if getattr(result, "ename", None) == "EngineError":
            why = "its engine died before its output ended"
        self._note_missing(md, md.get("engine_id"), msg_id, why)
        output.set_result(None)

    # -------------------------------------------------------- the socket
    def open(self):
        """I/O thread: after ``b""``, the hello topic (the relay answers it once
        it has both, see ``iopubrelay``); the periodic check of owed outputs."""
        client = self.client
        client._iopub_sock.setsockopt(zmq.SUBSCRIBE, HELLO_PREFIX + client.session.session.encode())
        every = min(1.0, client.output_timeout / 4) * 1e3
        client._loop.add_callback(PeriodicCallback(guarded_callback(self.check, "output check"), every).start)

    def heard(self):
        """Any IOPub message, even one that cannot be read, proves the subscription live."""
        if not self.live.is_set():
            self.live.set()

    def _probe(self):
        """A stock controller says no hello: one engine's ``status`` will do."""
        client = self.client
        engines = list(client._engine_table.values())
        if not engines:
            return  # nothing to ask; a cluster with no engine has no output to lose yet
        client._send_message(client._control_sock, "kernel_info_request", ident=engines[0].encode())
