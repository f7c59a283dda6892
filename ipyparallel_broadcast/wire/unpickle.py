"""Reading an engine's reduce value in a relay: a security boundary, since no
code but ours may run in the tree.

The value is a small pickle (plain values, and ipyparallel's ``CannedArray``
whose data travels in the next frame). Before it is loaded, its opcodes are
read (``pickletools``, which runs nothing): only those that make data and
that one object are allowed, and memo indices must be ones the pickle itself
could have made (CPython's unpickler sizes its memo by the largest index it
meets: a forged 7-byte pickle asked it for gigabytes). Then the unpickler
hands out one class, ``InertCannedArray``, with no code of its own.
"""

from __future__ import annotations

import io
import pickle
import pickletools
from collections import OrderedDict

MAX_BYTES = 1 << 16  # a value's pickle: its numbers and an array's header, never its data

# the opcodes of data (any protocol) and of one object made as pickle makes it
# (a class by name, NEWOBJ, BUILD); not REDUCE, INST, OBJ, extensions,
# persistent ids or out-of-band buffers
ALLOWED = frozenset(
    """PROTO FRAME STOP MARK POP POP_MARK DUP MEMOIZE PUT BINPUT LONG_BINPUT GET BINGET LONG_BINGET
    NONE NEWTRUE NEWFALSE INT BININT BININT1 BININT2 LONG LONG1 LONG4 FLOAT BINFLOAT
    STRING BINSTRING SHORT_BINSTRING UNICODE BINUNICODE SHORT_BINUNICODE BINUNICODE8
    BINBYTES SHORT_BINBYTES BINBYTES8 BYTEARRAY8
    EMPTY_TUPLE TUPLE TUPLE1 TUPLE2 TUPLE3 EMPTY_LIST LIST APPEND APPENDS
    EMPTY_DICT DICT SETITEM SETITEMS EMPTY_SET ADDITEMS FROZENSET
    GLOBAL STACK_GLOBAL NEWOBJ NEWOBJ_EX BUILD""".split()
)
MEMO = frozenset("PUT BINPUT LONG_BINPUT GET BINGET LONG_BINGET".split())


def canned_array_class():
    from ipyparallel.serialize.canning import CannedArray  # where the values are: not in relays

    return CannedArray


_inert: list = []  # InertCannedArray, made at first use


def inert_canned_array() -> type:
    """``CannedArray`` with no code of its own: made by the unpickler (with
    NEWOBJ, as engines pickle it), its ``__init__`` does nothing; its state
    is only what BUILD sets."""
    if not _inert:
        members = {"__init__": lambda self, *args, **kwargs: None, "__module__": __name__}
        _inert.append(type("InertCannedArray", (canned_array_class(),), members))
    return _inert[0]


class ValueUnpickler(pickle.Unpickler):
    """Loads no class but ``InertCannedArray`` (for ipyparallel's ``CannedArray``)."""

    def find_class(self, module, name):
        canned = canned_array_class()
        if (module, name) == (canned.__module__, "CannedArray"):
            return inert_canned_array()
        raise pickle.UnpicklingError(f"refused to load {module}.{name}")


_passed: OrderedDict[bytes, None] = OrderedDict()  # pickles that passed, newest last
PASSED_KEPT = 256  # the engines of one reduce send the same array header: checked once


def check(data: bytes) -> None:
    """Raise ``ValueError`` unless ``data`` is a pickle ``load`` may read."""
    if data in _passed:
        return
    if len(data) > MAX_BYTES:
        raise ValueError(f"a value's pickle of {len(data)} bytes (at most {MAX_BYTES})")
    ops = 0
    try:
        for op, arg, _ in pickletools.genops(data):
            ops += 1
            if op.name not in ALLOWED:
                raise ValueError(f"pickle opcode {op.name} is not allowed")
            if op.name in MEMO and not (type(arg) is int and 0 <= arg < ops):
                raise ValueError(f"memo index {arg!r} past what the pickle made")
    except ValueError:
        raise
    except Exception as e:  # truncated or malformed: genops says so in its own ways
        raise ValueError(f"a malformed pickle: {e!r}") from None
    if len(data) > 4096:
        return  # only small ones kept: 1 MiB at most
    _passed[data] = None
    if len(_passed) > PASSED_KEPT:
        _passed.popitem(last=False)


def load(data: bytes):
    """The value in ``data``, checked first (``check``), then unpickled."""
    check(data)
    return ValueUnpickler(io.BytesIO(data)).load()
