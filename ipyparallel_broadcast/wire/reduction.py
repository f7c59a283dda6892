"""In-tree reduction: a fixed set of operators on numbers and NumPy arrays.

Engines run ``engine_value(f, *args, **kwargs)``: it calls ``f`` and returns the
result as plain values plus, for arrays, one ``CannedArray`` of raw bytes. A
relay node reads that with ``unpickle``, which refuses every other class and
opcode, so no user code runs in the tree. Nodes combine values with ``OPS`` only and pass
them up as a JSON header plus one raw frame (``encode`` / ``decode``).

Every engine must give the same kind of value: Python numbers (combined with
Python's arithmetic), or NumPy arrays / scalars of one shape and dtype.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Sequence
from typing import Any, NamedTuple

from . import bundles as B
from . import protocol as P
from . import unpickle

OPS = {  # op -> (NumPy ufunc's name, Python function); NumPy loads on the first array
    "sum": ("add", operator.add),
    "prod": ("multiply", operator.mul),
    "min": ("minimum", min),
    "max": ("maximum", max),
}
_PY = (bool, int, float)


def ufunc(op: str):
    """The NumPy ufunc that combines arrays for ``op``."""
    import numpy as np

    return getattr(np, OPS[op][0])


class ReduceError(ValueError):
    """Engines gave values that cannot be combined (kind, shape or dtype)."""


_holders: list = []  # an engine's, once its relay shares its memory: see ``hold_values_with``


def hold_values_with(hold) -> None:
    """An engine's: ``hold(array)`` keeps a big value where it is, until its
    relay has the engines of its host combine theirs in its turn
    (``engine.holds``), and returns the token the relay asks for it by; or
    None to send the value as usual (too small)."""
    _holders[:] = [hold] if hold is not None else []


class Held(NamedTuple):
    """An engine's answer for a value it holds: what the value is, and its token."""

    dtype: str
    shape: list
    scalar: bool
    token: str
    nbytes: int

    @property
    def sig(self) -> tuple:
        import numpy as np

        return ("nd", np.dtype(self.dtype), tuple(self.shape), self.scalar)

    def value(self, data):
        """The value, read from ``data`` (its bytes, where they were combined)."""
        return _array(self.dtype, self.shape, self.scalar, data)


class RingValue(NamedTuple):
    """An allreduce's value that stays where it was combined: every host
    relay of a ring holds it whole (``relay.dataplane.ring``), and the root has their
    engines bind it. It stands for the value in a reduction."""

    dtype: str
    shape: tuple
    scalar: bool


def engine_value(f, *args, **kwargs):
    """Run ``f`` on the engine and return its result in the form nodes read."""
    value = f(*args, **kwargs)
    if type(value) in _PY:
        return ("py", value)
    import numpy as np

    if isinstance(value, complex):
        value = np.complex128(value)
    if isinstance(value, (np.ndarray, np.generic)):
        arr = np.asarray(value)
        if arr.dtype.hasobject or arr.dtype.fields is not None:
            raise TypeError(f"reduce cannot combine arrays of dtype {arr.dtype}")
        if not arr.flags.c_contiguous:
            arr = arr.copy(order="C")
        scalar = isinstance(value, np.generic)
        token = _holders[0](arr) if _holders and arr.size else None
        if token is not None:  # kept here until this host's engines combine theirs
            return ("held", arr.dtype.str, list(arr.shape), scalar, dict(token=token, nbytes=arr.nbytes))
        data = arr.reshape(-1).view(np.uint8) if arr.size else None
        return ("nd", arr.dtype.str, list(arr.shape), scalar, data)
    raise TypeError(f"reduce combines numbers and NumPy arrays, not {type(value).__name__}")


def assign(name: str, value):
    """Run on each engine by an allreduce's second half: bind the combined
    value to ``name`` in the engine's namespace (as ``push`` does), and count 1."""
    from IPython import get_ipython

    get_ipython().user_global_ns[name] = value
    return ("py", 1)


def assign_request(codec, msg_id: str, name: str, value) -> list:
    """The signed ``apply_request`` frames of ``assign(name, value)``: what the
    root sends the engines once an allreduce's value is combined. Its big
    buffers (an array's bytes, zero-copy) travel as a push's do."""
    from ipyparallel.serialize import pack_apply_message  # where the root makes one: not at import

    session = codec.session
    buffers = pack_apply_message(
        assign, (name, value), {}, buffer_threshold=session.buffer_threshold, item_threshold=session.item_threshold
    )
    header = dict(codec.header("apply_request"), msg_id=msg_id)
    metadata = {P.OUTPUTS_KEY: "reply", "is_broadcast": True}
    return codec.serialize("apply_request", {}, None, metadata, header)[1:] + buffers


def buffer_of(value, buffers) -> int | None:
    """The index of the buffer in ``buffers`` that is ``value``'s memory
    itself (an array pickled zero-copy), if one is."""
    import numpy as np

    data = np.asarray(value).reshape(-1).view(np.uint8)
    start = data.__array_interface__["data"][0]
    for i, buf in enumerate(buffers):
        if P.nbytes(buf) == data.nbytes and np.frombuffer(buf, np.uint8).__array_interface__["data"][0] == start:
            return i
    return None


def _buffer(frame):
    return frame.buffer if hasattr(frame, "buffer") else memoryview(frame)


def _array(dtype, shape, scalar, raw):
    import numpy as np

    dtype = np.dtype(str(dtype))
    if dtype.hasobject or dtype.fields is not None:
        raise ValueError(f"dtype {dtype} is not allowed")
    arr = np.frombuffer(raw, dtype=dtype).reshape([int(n) for n in shape])
    return arr[()] if scalar else arr


def decode_engine(buffers: Sequence) -> Any:
    """The value in an engine's ``engine_value`` reply buffers (no code runs),
    or the ``Held`` that stands for a value the engine keeps."""
    bufs = list(buffers)
    try:
        canned = unpickle.load(bytes(_buffer(bufs.pop(0))))
        if canned[0] == "py" and len(canned) == 2 and type(canned[1]) in _PY:
            return canned[1]
        kind, dtype, shape, scalar, data = canned
        if kind == "held":
            return _held(dtype, shape, scalar, data)
        if kind != "nd":
            raise ValueError(f"unknown kind {kind!r}")
        if data is None:
            return _array(dtype, shape, scalar, b"")
        if not (isinstance(data, unpickle.canned_array_class()) and not data.pickled and data.dtype == "|u1"):
            raise ValueError("the data is not one raw byte buffer")
        if data.buffers[0] is None:  # extracted when canned: the next frame (as ipyparallel restores it)
            data.buffers[0] = bufs.pop(0)
        return _array(dtype, shape, scalar, _buffer(data.buffers[0]))
    except Exception as e:
        raise ValueError(f"not a reduce value ({e})") from None


def _held(dtype, shape, scalar, data) -> Held:
    import numpy as np

    if not isinstance(data, dict) or type(data.get("token")) is not str or type(data.get("nbytes")) is not int:
        raise ValueError("a malformed held value")
    dt = np.dtype(str(dtype))
    if dt.hasobject or dt.fields is not None:
        raise ValueError(f"dtype {dt} is not allowed")
    if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
        raise ValueError(f"bad shape {shape!r}")
    if data["nbytes"] != dt.itemsize * int(np.prod(shape, dtype=np.int64)) or data["nbytes"] <= 0:
        raise ValueError("a held value whose size does not match its shape")
    return Held(dt.str, shape, scalar is True, data["token"], data["nbytes"])


def encode(value) -> tuple:
    """``(header, frames)`` of a combined value, to send up."""
    if isinstance(value, RingValue):
        return dict(t="ring", dtype=value.dtype, shape=list(value.shape), scalar=value.scalar), []
    if type(value) in _PY:
        # floats in hex and ints as text: exact through any JSON parser (orjson,
        # jupyter_client's default when installed, reads an int past 64 bits as a float)
        v = value.hex() if type(value) is float else str(value) if type(value) is int else value
        return dict(t="py", k=type(value).__name__, v=v), []
    import numpy as np

    arr = np.asarray(value)
    data = memoryview(arr.reshape(-1).view(np.uint8)) if arr.size else b""
    return dict(t="nd", dtype=arr.dtype.str, shape=list(arr.shape), scalar=isinstance(value, np.generic)), [data]


PARALLEL_FROM = 8 << 20  # bytes: an array this big is combined by several threads
_pool: list = []  # the threads that combine big arrays, made at first use


def combine_into(u, acc, value) -> None:
    """``u(acc, value, out=acc)``; a big array in slices on a few threads (NumPy
    lets go of the GIL): each element is combined as it would be in one pass,
    so the result is the same to the bit."""
    n = min(4, os.cpu_count() or 1)
    if acc.nbytes < PARALLEL_FROM or n < 2 or acc.ndim == 0:
        u(acc, value, out=acc)
        return
    if not _pool:
        from concurrent.futures import ThreadPoolExecutor

        _pool.append(ThreadPoolExecutor(n, thread_name_prefix="ipb-combine"))
    a, b = acc.reshape(-1), value.reshape(-1)
    step = -(-a.size // n)
    jobs = [_pool[0].submit(u, a[i : i + step], b[i : i + step], out=a[i : i + step]) for i in range(0, a.size, step)]
    for job in jobs:
        job.result()


def combine_bytes(op: str, dtype: str, first, second):
    """``op(first, second)`` of two equal runs of ``dtype`` values given as
    bytes (a chunk of two hosts' values in a chain): the result's bytes."""
    a, b = _array(dtype, [-1], False, first), _array(dtype, [-1], False, second)
    if a.shape != b.shape:
        raise ValueError("chunks of different sizes")
    return memoryview(ufunc(op)(a, b)).cast("B")


def decode(header: dict, frames: Sequence) -> Any:
    if header.get("t") == "py":
        kind, v = header.get("k"), header.get("v")
        if kind == "float" and isinstance(v, str):
            return float.fromhex(v)
        if kind == "int" and type(v) is str:
            return int(v)
        if kind in ("int", "bool") and type(v) in (int, bool):
            return v if kind == "int" else bool(v)
        raise ValueError(f"bad number {header!r}")
    if header.get("t") == "ring" and not frames:
        dtype, shape = header.get("dtype"), header.get("shape")
        if not isinstance(dtype, str) or not isinstance(shape, list) or not all(type(n) is int for n in shape):
            raise ValueError(f"bad value header {header!r}")
        return RingValue(dtype, tuple(shape), header.get("scalar") is True)
    if header.get("t") == "nd" and len(frames) == 1:
        return _array(header.get("dtype"), header.get("shape", ()), header.get("scalar"), _buffer(frames[0]))
    raise ValueError(f"bad value header {header!r}")


def _signature(value) -> tuple:
    if type(value) in _PY:
        return ("py",)
    if isinstance(value, RingValue):
        return ("ring", value.dtype, value.shape, value.scalar)
    import numpy as np

    return ("nd", np.dtype(value.dtype), np.shape(value), isinstance(value, np.generic))


def mismatch(op: str, eids, sig, other_eids, other_sig) -> str:
    """The error of engines that gave values of different kinds."""
    return (
        f"reduce('{op}') needs the same kind of value from every engine: "
        f"engines {sorted(eids)} gave {_describe(sig)}, engines {sorted(other_eids)} gave {_describe(other_sig)}"
    )


def _describe(sig) -> str:
    if sig[0] == "py":
        return "Python numbers"
    if sig[0] == "ring":
        return f"a {sig[1]} value of shape {sig[2]} combined among hosts"
    kind = "scalar" if sig[3] else f"array of shape {sig[2]}"
    return f"a {sig[1]} {kind}"


class Reduction:
    """What one node has combined so far: a value, the engines it covers, and
    the first incompatibility found (then nothing more is combined).

    Values are combined in a fixed order, whatever order they arrive in: by
    the first engine id each covers (``at``). A node that knows what it waits
    for (``expect``) combines each value as soon as every value before it is
    in; anything else waits until the result is read. So for the same targets
    and tree a float sum is bitwise the same on every run."""

    def __init__(self, op: str):
        if op not in OPS:
            raise ValueError(f"reduce op must be one of {sorted(OPS)}, not {op!r}")
        self.op = op
        self.value = None  # a Python number or an ndarray (0-d for scalars)
        self.sig = None  # what every value must match: see _signature
        self.eids: list[int] = []
        self.error: str | None = None
        self._owned = False  # whether self.value may be updated in place
        self.segment = None  # the shared-memory segment self.value lives in, if any (see ``add``)
        self._held: dict[int, list] = {}  # order key -> parts that came before their turn
        self._order: list[int] = []  # the keys expected, in order; combined up to ``_next``
        self._next = 0
        self.first: dict = {}  # a source (child) -> its order key, as ``expect`` was told
        self.outputs: dict[str, dict] = {}  # engine id (text) -> what it printed or displayed, if anything

    def expect(self, first: dict, engines=()) -> None:
        """The parts still to come: each child and its order key (the first
        engine id it serves), and engines (each its own id)."""
        self.first.update(first)
        self._order = sorted(set(self._order[self._next :]).union(first.values(), engines))
        self._next = 0
        self._advance()

    @property
    def empty(self) -> bool:
        """No value or error has come yet (engines that raised may have)."""
        return (
            self.sig is None
            and self.error is None
            and all(part[1] is None for parts in self._held.values() for part in parts)
        )

    @property
    def waiting(self) -> int:
        """Values held until the values before them come."""
        return sum(len(parts) for parts in self._held.values())

    def skip(self, at: int) -> None:
        """The part ``at`` brings no value here (its engine raised: its reply goes up raw)."""
        self._held.setdefault(at, [])
        self._advance()

    def add(self, eids: list[int], value, at: int | None = None, owned: bool = False, segment=None) -> None:
        """An engine's (or a subtree's) value, combined in its turn: ``at``
        (default: its first engine id). ``owned``: an array no one else reads,
        which may become the combined value and be updated in place;
        ``segment``: the shared-memory segment it lives in (the combined value
        may then go up by that segment's name: ``state``)."""
        self._hold(at, eids, (eids, value, owned, segment))

    def add_error(self, eids: list[int], message: str, at: int | None = None) -> None:
        self._hold(at, eids, (eids, ReduceError(message)))

    def _hold(self, at, eids, part) -> None:
        key = (min(eids) if eids else -1) if at is None else at
        self._held.setdefault(key, []).append(part)
        self._advance()

    def _advance(self) -> None:
        order, held = self._order, self._held
        while self._next < len(order) and order[self._next] in held:
            for part in held.pop(order[self._next]):
                self._combine(*part)
            self._next += 1

    def _settle(self) -> None:
        """Combine everything still held, in key order (the result is read)."""
        for key in sorted(self._held):
            for part in self._held.pop(key):
                self._combine(*part)
        self._order, self._next = [], 0

    def _combine(self, eids: list[int], value, owned: bool = False, segment=None) -> None:
        if value is None:  # a subtree that combined nothing (its engines raised or failed)
            self.eids.extend(eids)
            return
        if isinstance(value, ReduceError):
            self.eids.extend(eids)
            if self.error is None:
                self.error = str(value)
            return
        sig = _signature(value)
        if self.error is None and self.sig is not None and sig != self.sig:
            self.error = mismatch(self.op, self.eids, self.sig, eids, sig)
        self.eids.extend(eids)
        if self.error is not None:
            return
        if sig[0] == "nd":
            import numpy as np  # loaded by the first array a node combines

            value = np.asarray(value)
        if self.sig is None:
            self.sig, self.value, self._owned = sig, value, owned and sig[0] == "nd" and value.flags.writeable
            self.segment = segment if self._owned else None
        elif sig[0] == "ring":  # (every host of the ring holds the same value)
            return
        elif sig[0] == "py":
            self.value = OPS[self.op][1](self.value, value)
        elif self._owned:
            combine_into(ufunc(self.op), self.value, value)
        else:  # the first array may be a read-only view of a frame
            self.value = np.asarray(ufunc(self.op)(self.value, value))
            self._owned, self.segment = True, None

    @property
    def owned(self) -> bool:
        """Whether the combined value is this node's own array, to update in place."""
        return self._owned

    def add_partial(self, partial: dict, frames: Sequence, at: int | None = None, take=None) -> None:
        """Combine a child's ``state()`` in its turn ``at`` (see ``add``). A
        value it left in a shared-memory segment of this host is read with
        ``take(reference)``: the segment's bytes, writable, this node's own."""
        eids = partial.get("eids")
        if not isinstance(eids, list) or not all(type(e) is int for e in eids):
            raise ValueError("reduce state without engine ids")
        outputs = partial.get("outputs")
        if isinstance(outputs, dict):
            self.outputs.update((k, v) for k, v in outputs.items() if isinstance(v, dict))
        if partial.get("error"):
            return self.add_error(eids, str(partial["error"]), at)
        value = partial.get("value")
        if isinstance(value, dict) and value.get("t") == "shm":
            if take is None:
                raise ValueError("a value in shared memory, but this node shares none")
            ref = value.get("ref")
            try:
                data = take(ref)
            except OSError as e:  # its segment is gone, or not this node's to read
                return self.add_error(eids, f"reduce: the value of engines {sorted(eids)} cannot be read: {e}", at)
            arr = _array(value.get("dtype"), value.get("shape", ()), value.get("scalar") is True, data)
            return self._hold(at, eids, (eids, arr, True, ref))
        self._hold(at, eids, (eids, None if value is None else decode(value, frames)))

    def state(self, share=None) -> tuple:
        """``(dict, value frames)`` to send up; see ``add_partial``. With
        ``share``, a combined value that lives in a segment goes as the name
        ``share(segment)`` gives it (None: as bytes after all)."""
        self._settle()
        header, frames = None, []
        if self.error is None and self.sig is not None:
            ref = share(self.segment) if share is not None and self.segment is not None else None
            if ref is not None:
                header = dict(t="shm", dtype=self.sig[1].str, shape=list(self.sig[2]), scalar=self.sig[3], ref=ref)
            else:
                header, frames = encode(self._final())
        state = dict(op=self.op, eids=self.eids, value=header, error=self.error)
        if self.outputs:
            state["outputs"] = self.outputs
        return state, frames

    def result(self):
        """The final value at the client (``ReduceError`` if incompatible)."""
        self._settle()
        if self.error is not None:
            raise ReduceError(self.error)
        if self.sig is None:
            raise ReduceError(f"reduce('{self.op}'): no engine returned a value")
        return self._final()

    def partial(self):
        """What was combined so far, or ``None`` if nothing or incompatible."""
        self._settle()
        return self._final() if self.error is None and self.sig is not None else None

    def _final(self):
        return self.value[()] if self.sig[-1] is True and self.sig[0] == "nd" else self.value


# ------------------------------------------------------------ at a relay node
def fold_reply(reduction: Reduction, eids, body, codec, hold=None) -> bool:
    """Fold an engine's raw reply into ``reduction``. False if the engine's
    function raised: its reply is then passed up raw, as it came. A value the
    engine holds (``Held``) goes to ``hold(eid, held)`` instead: the engines
    of this node's host combine those where they are (``relay.hostfold``)."""
    try:
        status = codec.unpack_json(P.as_bytes(body[4])).get("status")
    except Exception:
        status = None
    if status != "ok":
        reduction.skip(eids[0])
        return False
    printed = _outputs(body[3], codec)
    if printed is not None:
        reduction.outputs[str(eids[0])] = printed
    try:
        value = decode_engine(body[5:])
        if isinstance(value, Held):
            if hold is None:
                raise ValueError("a value it holds, but this node shares no memory with it")
            hold(eids[0], value)
        else:
            reduction.add(eids, value)
    except ValueError as e:
        reduction.add_error(eids, f"reduce: engine {eids[0]} returned {e}")
    return True


def _outputs(metadata, codec) -> dict | None:
    """What an engine printed or displayed, from its reply's metadata (our
    engines put it there: ``protocol.OUTPUTS_KEY``); None if nothing."""
    raw = P.as_bytes(metadata)
    if P.OUTPUTS_MARK not in raw or codec.no_outputs in raw:  # (the usual case: no JSON parsed)
        return None
    try:
        out = codec.unpack_json(raw).get(P.OUTPUTS_KEY)
    except Exception:
        return None
    if not isinstance(out, dict) or not (out.get("stdout") or out.get("stderr") or out.get("outputs")):
        return None
    return {k: out[k] for k in ("stdout", "stderr", "outputs") if out.get(k)}


def fold_bundle(reduction: Reduction, msg: dict, codec, child=None, chained=None, take=None) -> tuple:
    """Fold ``child``'s ``reduced`` bundle (content unparsed) into ``reduction``,
    in its turn; return the raw replies of its engines that raised and its failures.
    A bundle whose value went another way (``chained`` in its state) is handed
    to ``chained(eids, at)`` instead; one left in a segment of this host is
    read with ``take`` (see ``Reduction.add_partial``)."""
    if msg["metadata"].get("kind") != "reduced":
        raise P.ProtocolError("expected a reduced bundle")
    try:
        msg["content"] = codec.unpack_json(P.as_bytes(msg["content"]))
        state, value, raised, failed = B.reduced_parts(msg)
        at = reduction.first.get(child)
        if state.get("chained") is True and chained is not None and not state.get("error"):
            chained(list(state.get("eids") or ()), at)
        else:
            reduction.add_partial(state, value, at, take)
    except (ValueError, TypeError, AttributeError) as e:
        raise P.ProtocolError(f"bad reduced bundle: {e}") from e
    return raised, failed
