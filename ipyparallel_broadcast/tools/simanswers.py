"""What a simulated engine answers: sans-I/O, shared by both kinds of farm.

``EngineAnswers.parse`` reads a request as it reaches an engine's shell;
``answer`` gives the reply frames for the shell and the messages for IOPub,
built without a ``Session.msg`` per reply (the farm must cost far less than
the engines it stands for). ``sim.SimProcess`` sends them on an engine's
own sockets; ``simhost.SimHostShell`` hands them to its relay node as if
they came on its engines' socket.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import traceback
import uuid as uuidlib
from datetime import UTC, datetime
from itertools import count as counter

from ipyparallel.serialize.serialize import MAX_BYTES, MAX_ITEMS
from jupyter_client.session import Session

from ..engine.applycall import serialize_result
from ..engine.kept import KeptReplies
from ..wire import protocol as P

log = logging.getLogger(__name__)
REPLY_TYPES = {"apply_request": "apply_reply", "execute_request": "execute_reply"}
REDUCE_MARK = b"engine_value"  # in the pickle of a reduce's function (``wire.reduction.engine_value``)
STOCK_BROADCAST_FIELDS = ("is_broadcast", "is_coalescing", "original_msg_id")  # as ipyparallel's kernel does
CONTENT = {
    "apply_reply": b'{"status": "ok"}',
    "execute_reply": b'{"status": "ok", "execution_count": 1}',
    "status": b'{"execution_state": "idle"}',
}
SIM_UUID_PREFIX = "sim-"  # simulated engines' uuids begin so (uuids have no "_")
KEPT = 4  # replies a simulated engine keeps for copies of their requests (a farm has 100,000 engines)
SEQ_MARK = P.SEQ_KEY.encode()


class SimEngineState:
    """What a simulated engine is, apart from any socket: its names, id and namespace."""

    def __init__(self):
        self.uuid = SIM_UUID_PREFIX + str(uuidlib.uuid4())  # a simulated engine says so
        self.ident = self.uuid.encode()
        self.id: int | None = None
        self.alive = True
        self.msg_ids = counter()
        self.namespace: dict | None = None  # execute's globals, made on first use
        # our client's calls' replies, until it has them: a copy (a call sent again after a
        # restart) is answered with the same reply and not run twice, as by a real engine
        self.kept = KeptReplies(most=KEPT)


class EngineAnswers:
    """Replies of simulated engines whose apply returns ``reply_bytes`` of result."""

    def __init__(self, session: Session, reply_bytes: int = 0):
        self.session = session
        # what apply returns: the buffers a real engine would send (``serialize_result``)
        self.result = serialize_result(b"\0" * reply_bytes, MAX_BYTES, MAX_ITEMS)
        # ... and what a reduce's ``engine_value`` returns: the number 1 (a scalar reduce counts engines)
        self.reduce_result = serialize_result(("py", 1), MAX_BYTES, MAX_ITEMS)

    def parse(self, engine: SimEngineState, frames) -> tuple | None:
        """A request's arguments for ``answer``; None: nothing to answer (not a
        request, or malformed: dropped and logged)."""
        try:
            idents, body = P.split_idents(frames)
            parent, request_md = P.as_bytes(body[1]), P.as_bytes(body[3])
            header = json.loads(parent)
            reply_type = REPLY_TYPES.get(header.get("msg_type"))
            started = header["date"]
        except (ValueError, IndexError, KeyError, AttributeError) as e:
            log.warning("engine %s dropped a malformed request: %r", engine.id, e)
            return None
        if reply_type is None:
            return None
        if reply_type == "execute_reply":
            reply_type = (reply_type, body[4])  # the content: its code runs when answered
        elif len(body) > 5 and REDUCE_MARK in P.as_bytes(body[5]):  # a reduce's apply (its function's pickle)
            reply_type = (reply_type, None)
        return (engine, [P.as_bytes(i) for i in idents], parent, started, reply_type, request_md)

    def signed(self, engine: SimEngineState, msg_type: str, parent: bytes, metadata: dict, content=None) -> list:
        """``[DELIM, sig, header, parent, metadata, content]``."""
        header = json.dumps(
            dict(
                msg_id=f"{engine.uuid}_{next(engine.msg_ids)}",
                msg_type=msg_type,
                session=engine.uuid,
                username="sim",
                date=datetime.now(UTC).isoformat(),
                version="5.3",
            )
        ).encode()
        parts = [header, parent, json.dumps(metadata).encode(), content or CONTENT[msg_type]]
        return [P._DELIM, self.session.sign(parts)] + parts

    def answer(
        self, engine: SimEngineState, idents, parent: bytes, started: str, reply_type, request_md: bytes
    ) -> tuple[list, list]:
        """(the reply on the shell, with ``idents``; the IOPub messages, each with its topic)."""
        header = json.loads(parent)  # (checked by ``parse``)
        kept = engine.kept.again(header.get("msg_id"), header.get("session"))
        if kept is not None:  # a copy: the same reply, under the copy's route; nothing run
            return idents + kept, []
        reply, published = self._answer(engine, idents, parent, started, reply_type, request_md)
        if SEQ_MARK in request_md:  # our client's: kept until it says it has the reply
            md = json.loads(request_md)
            engine.kept.arrived(header["msg_id"], header, md)
            engine.kept.keep(header["msg_id"], header, md, reply[len(idents) :])
        return reply, published

    def _answer(self, engine: SimEngineState, idents, parent: bytes, started: str, reply_type, request_md: bytes):
        md = dict(engine=engine.uuid, status="ok", started=started, dependencies_met=True)
        content, published = None, []
        buffers = self.result
        if isinstance(reply_type, tuple) and reply_type[1] is None:
            reply_type, buffers = reply_type[0], self.reduce_result
        elif isinstance(reply_type, tuple):
            reply_type, request = reply_type
            content = self.execute(engine, parent, request, published)
            md["status"] = json.loads(content)["status"]
        if b"original_msg_id" in request_md:  # ipyparallel's BroadcastView: echo its routing fields
            try:
                theirs = json.loads(request_md)
            except ValueError:
                theirs = {}
            md.update((k, theirs.get(k)) for k in STOCK_BROADCAST_FIELDS)
        buffers = buffers if reply_type == "apply_reply" else []
        lean = reply_type == "apply_reply" and P.OUTPUTS_MARK in request_md
        if lean:  # as our engines (kernel.py): the outputs in the reply, no IOPub status
            md[P.OUTPUTS_KEY] = dict(stdout="", stderr="", outputs=[])
        reply = idents + self.signed(engine, reply_type, parent, md, content) + buffers
        if not lean:
            topic = f"engine.{engine.id}.status".encode()
            published.append([topic] + self.signed(engine, "status", parent, dict(engine=engine.uuid)))
        return reply, published

    def execute(self, engine: SimEngineState, parent: bytes, request, published: list) -> bytes:
        """Run an execute_request's code (what it printed: into ``published``); the reply's content."""
        try:
            code = json.loads(P.as_bytes(request)).get("code", "")
        except (ValueError, AttributeError):
            code = ""
        if engine.namespace is None:
            engine.namespace = {"engine_id": engine.id}
        printed = io.StringIO()
        reply = {"status": "ok", "execution_count": 1}
        try:
            with contextlib.redirect_stdout(printed):
                exec(compile(code, "<sim execute>", "exec"), engine.namespace)  # noqa: S102 (a test engine)
        except Exception as e:
            reply = dict(
                status="error",
                execution_count=1,
                ename=type(e).__name__,
                evalue=str(e),
                traceback=traceback.format_exception(e),
                engine_info=dict(engine_id=engine.id, engine_uuid=engine.uuid, method="execute"),
            )
        if printed.getvalue():
            stream = json.dumps(dict(name="stdout", text=printed.getvalue())).encode()
            topic = f"engine.{engine.id}.stream".encode()
            published.append([topic] + self.signed(engine, "stream", parent, {}, stream))
        return json.dumps(reply).encode()
