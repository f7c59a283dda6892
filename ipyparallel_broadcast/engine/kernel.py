"""The engine's kernel: ipyparallel's, with a lean path for broadcast applies.

A stock engine answers each request with five messages: IOPub ``busy``, the
outputs (each a message, through the IOPub thread, flushed with a cross-thread
wait), the reply, then IOPub ``idle``. The controller relays and records every
one and the client parses them, per engine.

An ``apply_request`` whose metadata says ``OUTPUTS_KEY: "reply"`` (our
BroadcastView sends that unless ``stream_outputs`` is on) is answered with the
reply alone: what the call printed to ``sys.stdout``/``sys.stderr`` and showed
with ``display()`` rides in the reply's metadata, errors in its content, and no
status is published. Only if the call publishes data (``publish_data``) does
the engine still send IOPub ``idle`` after the reply, and the reply says so, so
the client waits for it. Everything else (execute, ``%px``, DirectView, stock
clients) goes through ipyparallel's path unchanged.
"""

from __future__ import annotations

import _signal
import asyncio
import io
import sys
import time
from contextvars import copy_context

from ipykernel.kernelbase import Kernel
from ipyparallel import error
from ipyparallel.engine.kernel import IPythonParallelKernel
from traitlets import Integer

from ..compat import ipykernel as ipk
from ..compat.pyzmq import Direct, lean
from ..host import shm
from ..wire import protocol as P
from ..wire.protocol import OUTPUTS_KEY
from .applycall import Functions, run_apply
from .holds import HoldingKernel
from .kept import KeptReplies
from .refusals import refuse, refused_replay

_SIGINT = int(_signal.SIGINT)


def outputs_in_reply(frames):
    """``(idents, body)`` of a raw request that asks for its outputs in the
    reply, else None. (Looks only at the small metadata frame; the signature
    is checked when it is parsed.)"""
    try:
        idents, body = P.split_idents(frames)  # [sig, header, parent, metadata, content, ...]
    except P.ProtocolError:
        return None
    return (idents, body) if len(body) > 3 and P.OUTPUTS_MARK in P.as_bytes(body[3]) else None


class _Displays:
    """Stands in for the shell's display publisher during a lean request."""

    def __init__(self, real):
        self.real, self.outputs = real, []

    def publish(self, data, metadata=None, transient=None, update=False, **kwargs):
        self.outputs.append(dict(data=data, metadata=metadata or {}, transient=transient or {}))

    def clear_output(self, wait=False):
        self.outputs.clear()

    def __getattr__(self, name):
        return getattr(self.real, name)


class _Data:
    """Stands in for the data publisher: data still goes out on IOPub (it is
    pickled objects), with this request as its parent, and the reply tells the
    client to wait for ``idle``."""

    def __init__(self, real, parent):
        self.real, self.parent, self.used = real, parent, False

    def publish_data(self, data):
        if not self.used:
            self.real.set_parent(self.parent)
            self.used = True
        self.real.publish_data(data)

    def __getattr__(self, name):
        return getattr(self.real, name)


class Captured:
    """Swaps in the stand-ins for one request, and restores what was there."""

    def __init__(self, shell, parent):
        self.shell = shell
        self.stdout, self.stderr = io.StringIO(), io.StringIO()
        self.displays = _Displays(shell.display_pub)
        self.data = _Data(shell.data_pub, parent)

    def _showtraceback(self, etype, evalue, stb):
        ipk.set_last_traceback(self.shell, stb)  # the reply carries it; nothing on IOPub

    def __enter__(self):
        shell = self.shell
        self.saved = sys.stdout, sys.stderr, shell.display_pub, shell.data_pub
        sys.stdout, sys.stderr = self.stdout, self.stderr
        shell.display_pub, shell.data_pub = self.displays, self.data
        ipk.hide_showtraceback(shell, self._showtraceback)
        return self

    def __exit__(self, *exc):
        shell = self.shell
        sys.stdout, sys.stderr, shell.display_pub, shell.data_pub = self.saved
        ipk.restore_showtraceback(shell)
        return False

    def outputs(self) -> dict:
        out = dict(stdout=self.stdout.getvalue(), stderr=self.stderr.getvalue(), outputs=self.displays.outputs)
        if self.data.used:
            out["iopub"] = True
        return out


class BroadcastKernel(HoldingKernel, IPythonParallelKernel):
    _codec = None
    _context = None
    _queued = 0  # shell messages on ipykernel's path, not yet done
    kept_replies = Integer(
        1024, config=True, help="Broadcast replies kept until the client has them (a restarted controller's resend)."
    )
    kept_reply_bytes = Integer(64 << 20, config=True, help="Bytes of buffers those kept replies may hold.")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.functions = Functions()
        self.kept = KeptReplies(self.kept_replies, self.kept_reply_bytes)

    @property
    def codec(self) -> P.Codec:
        """The lean path's messages, read and signed with the session's key read
        once (``Session.deserialize``/``send`` read its traitlets per message)."""
        if self._codec is None or self._codec.session is not self.session:
            self._codec = P.Codec(self.session)
        return self._codec

    def start(self):
        super().start()
        if self.shell_stream is not None and ipk.lean_path_possible(self):
            self._context = copy_context()  # shared by the shell's tasks, as ipykernel's are
            self._released = asyncio.Event()
            lean(self.shell_stream).on_recv(self._on_shell, copy=False)

    def _on_shell(self, msg):
        """Every shell message. A broadcast apply runs here and now when no
        other shell message is running or waiting (no task, no lock: the
        stream's callback is the handler); anything else, or anything behind a
        message still on ipykernel's path, takes that path, in arrival order.
        Nothing raises out of here: the stream must go on reading."""
        try:
            msg = self._shared(msg)
            if msg is None:
                return
            busy = self._queued or ipk.shell_busy(self) or self.holding
            if busy or self._lean(msg, time.time()) is False:
                self._queued += 1
                asyncio.get_running_loop().create_task(self._counted(msg), context=self._context)
        except Exception:
            self.log.error("Exception handling a shell message", exc_info=True)

    async def _counted(self, msg):
        try:
            await self.until_released()  # a value kept for the relay must not change meanwhile
            await self.shell_main(None, msg)
        finally:
            self._queued -= 1

    async def dispatch_shell(self, msg, *args, **kwargs):
        received = time.time()
        if P.is_probe(msg):  # a restarted host relay looking for its engines
            return
        msg = self._shared(msg)
        if msg is None:
            return
        if P.may_be_dropped(msg) and self.on_drop_notice(msg):
            return
        if refused_replay(self, msg):
            return
        if self._lean(msg, received) is False:
            return await super().dispatch_shell(msg, *args, **kwargs)

    def _lean(self, msg, received):
        """Answer a broadcast apply with its one reply; False if ``msg`` is not
        one (it then takes ipykernel's path)."""
        parts = outputs_in_reply(msg)
        if parts is None:
            return False
        idents, body = parts
        if b'"apply_request"' not in P.as_bytes(body[1]) or ipk.aborting(self):  # (ipykernel aborts)
            return False
        try:
            if self.codec.seen(body[0]):  # a copy, as signed the first time: sent again after a restart
                self.codec.check_signature(body)
                return self._again(idents, msg, self.session.unpack(P.as_bytes(body[1])))
            request = self.codec.unpack(body)
            header = request["header"]
            if header.get("msg_type") != "apply_request":
                raise P.ProtocolError(f"not an apply_request: {header.get('msg_type')!r}")
        except Exception:
            self.log.error("Invalid Message", exc_info=True)
            return None
        if not self.kept.arrived(header["msg_id"], header, request["metadata"]):  # a copy signed anew
            return self._again(idents, msg, header)
        request["buffers"] = [memoryview(b) for b in request["buffers"]]
        Kernel.set_parent(self, idents, request, "shell")  # the shell's parts: see Captured
        stream = self.shell_stream
        msg_id = header["msg_id"]
        if msg_id in self.aborted:  # as ipyparallel's should_handle, without an INFO line a call
            self.aborted.remove(msg_id)
            return self.reply(stream, idents, request, {"status": "aborted"}, [], None, {})
        saved = _signal.signal(_SIGINT, _signal.default_int_handler)  # pre_handler_hook, no enums
        try:
            self.apply_outputs_in_reply(stream, idents, request, received)
        except Exception:  # our plumbing failed, not the call: the client still gets a reply
            self.log.error("Exception in apply_request %s:", msg_id, exc_info=True)
            content = error.wrap_exception(self.get_engine_info(method="apply"))
            self.reply(stream, idents, request, content, [], None, {})
        finally:
            _signal.signal(_SIGINT, saved)
            request["buffers"] = []  # see apply_request
        return None

    def _again(self, idents, msg, header: dict):
        """A copy of a request this engine had: its kept reply, under the copy's route (never run twice)."""
        msg_id, session = header.get("msg_id"), header.get("session")
        frames = self.kept.again(msg_id, session)
        if frames is None:
            why = self.kept.missing(msg_id, session)
            refuse(self, msg, f"engine {self.int_id} did not answer a request again: {why}")
        else:
            Direct(self.shell_stream).send_multipart(list(idents) + frames, copy=False)
        return None

    def apply_request(self, stream, ident, parent):
        """ipyparallel's, then the request's buffers are let go: it stays the
        shell's parent (its header routes later output) until the next request,
        and its buffers would keep a pushed value alive after ``del``."""
        try:
            return super().apply_request(stream, ident, parent)
        finally:
            if isinstance(parent, dict):
                parent["buffers"] = []

    compose_runtime = None  # the composable runtime (compose.runtime().attach): requests run inside it

    def do_apply(self, content, bufs, msg_id, reply_metadata):
        """ipyparallel's, with ``f`` called directly and unpickled once per
        distinct function (``applycall``), inside the composable runtime's request."""
        runtime = self.compose_runtime
        if runtime is not None:
            if runtime.mode == "counting":
                with runtime.request():
                    return self._run_apply(bufs)
            runtime.refresh()
        return self._run_apply(bufs)

    async def do_execute(self, *args, **kwargs):
        """ipykernel's, inside the composable runtime's request."""
        runtime = self.compose_runtime
        if runtime is None:
            return await super().do_execute(*args, **kwargs)
        with runtime.request():
            return await super().do_execute(*args, **kwargs)

    def _run_apply(self, bufs):
        session = self.session
        return run_apply(
            bufs,
            self.shell.user_ns,
            self.functions,
            session.buffer_threshold,
            session.item_threshold,
            self._apply_error,
        )

    def _apply_error(self, e: BaseException) -> dict:
        """A failed apply's reply content, as ipyparallel's ``do_apply`` makes it."""
        shell = self.shell
        try:
            shell.showtraceback()  # formats it; ipykernel keeps it in _last_traceback
        except Exception as tb_error:
            self.log.error(f"Failed to show traceback for {e}: {tb_error}")
        try:
            evalue = str(e)
        except Exception as str_error:
            evalue = f"Failed to cast exception to string: {str_error}"
        content = dict(
            status="error",
            ename=type(e).__name__,
            evalue=evalue,
            traceback=ipk.last_traceback(shell),
            engine_info=self.get_engine_info(method="apply"),
        )
        ipk.set_last_traceback(shell, None)
        self.log.info("Exception in apply request:\n%s", "\n".join(content["traceback"]))
        return content

    def _shared(self, msg):
        """A relay's greeting is answered (None); a request whose big buffers
        are in shared memory gets them mapped in place (None if they cannot
        be: the request is answered with the error); anything else is as it came."""
        at = shm.reference_in(msg)
        if at is None:
            key = P.as_bytes(msg[1]) if len(msg) > 2 and len(msg[1]) in (len(P.HELLO_KEY), len(P.FOLD_KEY)) else None
            if key == P.HELLO_KEY:
                self._greeted(msg)
                return None
            if key == P.FOLD_KEY:
                self._fold_message(msg)
                return None
            return msg
        try:
            return shm.expand(msg, at, self.codec.sign)
        except shm.ShmError as e:
            self.log.error("a request's shared buffers cannot be mapped: %s", e)
            refuse(self, msg[:at] + msg[at + 1 :], f"engine {self.int_id} could not map a shared-memory buffer: {e}")
            return None

    def on_drop_notice(self, msg) -> bool:
        """The hub dropped this engine (its host was cut off) and will not take
        it back, as its host relay or the hub tells it: exit cleanly, as a lost
        engine should. False if the message is something else."""
        try:
            _, body = self.session.feed_identities(msg, copy=False)
            if self.session.unpack(P.as_bytes(body[1])).get("msg_type") != P.DROPPED:
                return False
            self.session.deserialize(body, content=False, copy=False)  # its signature
        except Exception:
            self.log.error("Invalid Message", exc_info=True)
            return True
        self.log.critical("the hub dropped this engine (its host was cut off); exiting")
        self.io_loop.add_callback(self.io_loop.stop)
        return True

    def apply_outputs_in_reply(self, stream, ident, parent, received=None):
        """ipyparallel's ``apply_request``, outputs captured into the reply
        (and, for a traced request, when it reached this process)."""
        md = self.init_metadata(parent)
        if parent["metadata"].get(P.TRACE_KEY):
            md["ipb_received"] = received
        with Captured(self.shell, parent) as captured:
            self.shell_is_blocking = True
            try:
                content, result_buf = self.do_apply(
                    parent["content"], parent["buffers"], parent["header"]["msg_id"], md
                )
            finally:
                self.shell_is_blocking = False
        self.reply(stream, ident, parent, content, result_buf, md, captured.outputs())

    def reply(self, stream, ident, parent, content, buffers, md, outputs):
        """The one message a lean request gets; ``md`` None: an aborted request's."""
        md = self.finish_metadata(parent, self.init_metadata(parent) if md is None else md, content)
        if content["status"] == "aborted":
            md["status"] = "aborted"
        md[OUTPUTS_KEY] = outputs
        if buffers and P.SHM_REPLY_KEY in parent["metadata"]:  # a client of this host: big buffers shared
            buffers = shm.share_reply(buffers, parent["metadata"][P.SHM_REPLY_KEY], md)
        frames = self.codec.serialize("apply_reply", content, parent["raw_header"], md)
        self.kept.keep(parent["header"]["msg_id"], parent["header"], parent["metadata"], frames + list(buffers))
        # at once on the socket, by this (the loop's) thread: one event-loop turn less
        Direct(stream).send_multipart(list(ident) + frames + list(buffers), copy=False)
        if outputs.get("iopub"):
            ipk.publish_idle(self)
