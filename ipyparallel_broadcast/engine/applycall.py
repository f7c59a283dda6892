"""An ``apply_request`` run on an engine, without I/O: buffers in, reply out.

ipyparallel's ``do_apply`` unpickles ``f`` on every call, then compiles and
``exec``s a code string that calls it through names put in the user
namespace. Here ``f`` is called directly, and a function whose state cannot
change between calls is unpickled once per distinct pickle (``Functions``).
What the caller sees is the same: the result, or the error's traceback
(IPython's formatting, with one frame less: no ``<string>``).
"""

from __future__ import annotations

import pickle
import types
from collections import OrderedDict
from collections.abc import Callable, Sequence

from ipyparallel.serialize import serialize_object
from ipyparallel.serialize.serialize import PICKLE_PROTOCOL, deserialize_object

_IMMUTABLE = (type(None), bool, int, float, complex, str, bytes, frozenset, range)


def _immutable(value) -> bool:
    if isinstance(value, tuple):
        return all(_immutable(v) for v in value)
    return type(value) in _IMMUTABLE


def reusable(f) -> bool:
    """Can one unpickled ``f`` serve later calls as a fresh unpickle would?
    Only a plain function with no closure cells, no attributes and immutable
    defaults: nothing a call could change and the next one see."""
    return (
        type(f) is types.FunctionType
        and f.__closure__ is None
        and not f.__dict__
        and _immutable(f.__defaults__)
        and all(_immutable(v) for v in (f.__kwdefaults__ or {}).values())
    )


class Functions:
    """Unpickled functions, keyed by their pickle's bytes (a bounded LRU).
    Only ``reusable`` functions whose pickle is one self-contained buffer are
    kept; anything else is unpickled per call, as ipyparallel does."""

    def __init__(self, size: int = 64):
        self.size = size
        self._kept: OrderedDict = OrderedDict()
        self.hits = self.misses = 0

    def load(self, bufs: Sequence, g) -> tuple[Callable, int]:
        """``f`` and the number of buffers it took from the front of ``bufs``."""
        key = bytes(bufs[0])
        f = self._kept.get(key)
        if f is not None:
            if f.__dict__:  # a call gave it attributes: no longer as unpickled
                del self._kept[key]
            else:
                self._kept.move_to_end(key)
                self.hits += 1
                return f, 1
        self.misses += 1
        f, rest = deserialize_object(bufs, g)
        used = len(bufs) - len(rest)
        if used == 1 and reusable(f):
            self._kept[key] = f
            if len(self._kept) > self.size:
                self._kept.popitem(last=False)
        return f, used


def unpack_call(bufs: Sequence, g, functions: Functions):
    """``f, args, kwargs`` from the buffers ``pack_apply_message`` made."""
    if len(bufs) < 2:
        raise ValueError("an apply request needs at least 2 buffers")
    f, used = functions.load(bufs, g)
    info = pickle.loads(bufs[used])
    rest = list(bufs[used + 1 :])
    args = []
    for _ in range(info["nargs"]):
        arg, rest = deserialize_object(rest, g)
        args.append(arg)
    kwargs = {}
    for key in info["kw_keys"]:
        kwargs[key], rest = deserialize_object(rest, g)
    if rest:
        raise ValueError(f"{len(rest)} buffers left over in an apply request")
    return f, tuple(args), kwargs


def run_apply(
    bufs: Sequence,
    g,
    functions: Functions,
    buffer_threshold: int,
    item_threshold: int,
    on_error: Callable[[BaseException], dict],
):
    """``(reply content, result buffers)`` of one apply: ``on_error`` makes the
    content of an exception raised while unpacking, calling or serializing."""
    try:
        f, args, kwargs = unpack_call(bufs, g, functions)
        result = f(*args, **kwargs)
        result_buf = serialize_result(result, buffer_threshold, item_threshold)
    except BaseException as e:
        return on_error(e), []
    return {"status": "ok"}, result_buf


def serialize_result(result, buffer_threshold: int, item_threshold: int) -> list:
    """``serialize_object(result)``, with ``bytes`` no larger than the buffer
    threshold pickled as they are. ipyparallel cans every ``bytes`` as a
    ``CannedBytes``, so that a large one's buffer goes as a frame of its own; a
    small one stays inside the pickle either way, and canned it costs a class
    instance to make and to unpickle (1.15 against 0.18 µs per ``loads``, times
    every engine at the client). Any ipyparallel client reads both alike:
    ``uncan`` returns plain ``bytes`` as they are."""
    if type(result) is bytes and len(result) <= buffer_threshold:
        return [pickle.dumps(result, PICKLE_PROTOCOL)]
    return serialize_object(result, buffer_threshold=buffer_threshold, item_threshold=item_threshold)
