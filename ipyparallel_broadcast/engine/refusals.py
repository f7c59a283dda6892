"""Requests an engine answers with an error instead of running them: one
whose shared-memory buffers cannot be mapped, and one it has already
received (a replay). Each answer is a normal ``*_reply`` with the metadata a
task queue reads (``status``), so that whatever waits on the request ends:
ipykernel drops a replay unanswered, and a task queue then held that engine's
only slot for good (the chaos soak's replay through the mux and the task
queue). Functions of the kernel's public parts (its session, codec, shell
stream and metadata methods)."""

from __future__ import annotations

from ipyparallel import error

from ..wire import protocol as P


def refuse(kernel, msg, why: str) -> None:
    """Answer the request ``msg`` (idents and a signed body) with an error
    naming ``why``; a message whose signature does not check is only logged."""
    try:
        idents, body = P.split_idents(msg)
        kernel.codec.check_signature(body[:5])
        parent = kernel.session.unpack(P.as_bytes(body[1]))
        request_md = kernel.session.unpack(P.as_bytes(body[3]))
    except Exception:
        kernel.log.error("Invalid Message", exc_info=True)
        return
    reply_type = parent.get("msg_type", "apply_request").replace("_request", "_reply")
    try:
        raise RuntimeError(why)
    except RuntimeError:
        content = error.wrap_exception(kernel.get_engine_info(method="apply"))
    md = kernel.init_metadata({"header": parent, "metadata": request_md})
    md = kernel.finish_metadata(parent, md, content)
    kernel.session.send(kernel.shell_stream, reply_type, content, parent=parent, ident=idents, metadata=md)


def refused_replay(kernel, msg) -> bool:
    """If this engine has seen ``msg``'s signature, answer it with an error
    (a genuine copy only: ``refuse`` checks it) and say so."""
    try:
        signature = P.as_bytes(P.split_idents(msg)[1][0])
    except Exception:
        return False
    if signature not in kernel.session.digest_history:
        return False
    kernel.log.error("a request this engine has already received came again (a replay); refused")
    refuse(kernel, msg, f"engine {kernel.int_id} refused a request it had already received (a replay)")
    return True
