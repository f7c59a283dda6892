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
from traitlets import Float

from ..compat.ipp import ClientSeam
from ..wire.naming import IOPUB_HELLO_PREFIX as HELLO_PREFIX
from ..wire.naming import TREE_KEY
from .guard import guarded_callback
from .results import outcome_metadata

log = logging.getLogger(__name__)


class IOPubLiveness(ClientSeam):
    """Mixin of our Client: the wait for a live IOPub subscription at connect."""

    iopub_timeout = Float(
        10.0,
        config=True,
        help="Seconds a new client waits for proof that its IOPub subscription is live "
        "before it sends anything (outputs published before it is live are lost); 0: no wait.",
    )

    output_timeout = Float(
        10.0,
        config=True,
        help="Seconds after an engine's reply that its output may still come on IOPub; "
        "then wait_for_output() stops waiting for it, and its stderr says so.",
    )

    def __init__(self, *args, **kwargs):
        self._iopub_live = threading.Event()  # before the I/O thread can deliver
        self._output_owed: dict[tuple, float] = {}  # (msg_id, index) -> when first seen owed
        self.iopub_wait = None  # seconds the connect waited for it
        super().__init__(*args, **kwargs)
        tic = time.perf_counter()
        if not self._iopub_live.is_set() and TREE_KEY not in self._connection_info:
            self._probe_iopub()
        waited = self.iopub_timeout > 0 and self._iopub_live.wait(self.iopub_timeout)
        if self.iopub_timeout > 0 and not waited and (TREE_KEY in self._connection_info or self.ids):
            log.warning(
                "No sign within %.0f s that this client's IOPub subscription is live: "
                "outputs of its first requests may be lost",
                self.iopub_timeout,
            )
        self.iopub_wait = time.perf_counter() - tic

    # ------------------------------------------------------ overdue outputs
    def _owed_outputs(self):
        """``(key, close)`` for each reply that is in while its output is not:
        broadcast engines and ipyparallel's own requests (I/O thread)."""
        for call in list(self._calls.live.values()):
            if call.left or not call.iopub:
                continue
            for i, o in enumerate(call.outcomes):
                if o is not None and o[0] == "reply" and o[2]:
                    yield (call.msg_id, i), partial(self._close_broadcast_output, call, i)
        futures = self._reply_futures
        for msg_id, output in list(self._iopub_futures.items()):
            reply = futures.get(msg_id)
            if not output.done() and reply is not None and reply.done() and not self._calls.of_vid(msg_id)[0]:
                yield (msg_id, None), partial(self._close_output, msg_id, output)

    def _check_outputs(self):
        """Close outputs owed longer than ``output_timeout`` (a periodic tick)."""
        now, seen, owed = time.monotonic(), self._output_owed, {}
        for key, close in self._owed_outputs():
            first = owed[key] = seen.get(key, now)
            if now - first >= self.output_timeout:
                del owed[key]
                close(
                    f"its reply came {now - first:.0f} s ago or more, and the end of its output "
                    "(its 'idle' status on IOPub) did not"
                )
        self._output_owed = owed

    def _note_missing(self, md, eid, msg_id, why):
        note = f"[ipyparallel_broadcast] output from engine {eid} may be incomplete: {why}\n"
        md["stderr"] = (md.get("stderr") or "") + note
        log.warning("Output of %s from engine %s did not all come: %s", msg_id, eid, why)

    def _close_broadcast_output(self, call, i, why):
        self._note_missing(outcome_metadata(self, call, i), call.eids[i], call.vids[i], why)
        self._output_done(call, i)

    def _close_output(self, msg_id, output, why):
        md = self.metadata[msg_id]
        result = self._reply_futures[msg_id].result()
        if getattr(result, "ename", None) == "EngineError":
            why = "its engine died before its output ended"
        self._note_missing(md, md.get("engine_id"), msg_id, why)
        output.set_result(None)

    @property
    def _hello_topic(self) -> bytes:
        return HELLO_PREFIX + self.session.session.encode()

    def _open_streams(self):
        """I/O thread: after ``b""``, the hello topic (the relay answers it once
        it has both, see ``iopubrelay``)."""
        super()._open_streams()
        self._iopub_sock.setsockopt(zmq.SUBSCRIBE, self._hello_topic)
        checks = PeriodicCallback(
            guarded_callback(self._check_outputs, "output check"), min(1.0, self.output_timeout / 4) * 1e3
        )
        self._loop.add_callback(checks.start)

    def _read_iopub(self, frames):
        """Any IOPub message, even one that cannot be read, proves the subscription live."""
        if not self._iopub_live.is_set():
            self._iopub_live.set()
        return super()._read_iopub(frames)

    def _probe_iopub(self):
        """A stock controller says no hello: one engine's ``status`` will do."""
        engines = list(self._engine_table.values())
        if not engines:
            return  # nothing to ask; a cluster with no engine has no output to lose yet
        self._send_message(self._control_sock, "kernel_info_request", ident=engines[0].encode())
