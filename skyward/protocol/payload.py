"""Payloads: a task, its arguments or its result, pickled once and sent as frame parts.

Part 1 of a frame that carries a payload is a protocol-5 pickle and parts 2.. are its
out-of-band buffers, so a large numpy array or torch tensor goes over the stream as its own
bytes without being copied into the pickle. A broadcast pickles its task once and sends the
same :class:`Payload` to every worker.
"""

from __future__ import annotations

import io
import pickle
import types
from collections.abc import Sequence
from typing import Any


class Payload:
    """A pickled value: the pickle plus its out-of-band buffers. Serialize once, send many."""

    __slots__ = ("data", "buffers")

    def __init__(self, data: bytes | memoryview, buffers: Sequence[memoryview | bytes | bytearray] = ()):
        self.data = data
        self.buffers = list(buffers)

    @property
    def parts(self) -> list[Any]:
        return [self.data, *self.buffers]

    @property
    def nbytes(self) -> int:
        return sum(memoryview(p).nbytes for p in self.parts)


#: Types the C pickler stores by value, exactly as cloudpickle would.
_PLAIN = frozenset({type(None), bool, int, float, complex, str, bytes, bytearray, range, slice})


def is_plain(value: Any, depth: int = 0) -> bool:
    """True if stdlib pickle gives the same stream as cloudpickle (checked shallowly, cheaply).

    Anything that pickles by reference (functions, classes, instances of classes defined in
    ``__main__``) must go through cloudpickle, which stores such things by value.
    """
    t = type(value)
    if t in _PLAIN:
        return True
    if depth >= 3:
        return False
    if t is tuple or t is list:
        if len(value) > 64:
            return False
        for v in value:  # (a loop, not all(): this runs on every call's arguments)
            if type(v) not in _PLAIN and not is_plain(v, depth + 1):
                return False
        return True
    if t is dict:
        return not value or len(value) <= 64 and all(is_plain(k, depth + 1) and is_plain(v, depth + 1) for k, v in value.items())
    if t.__name__ == "ndarray" and t.__module__ == "numpy":
        return not value.dtype.hasobject
    return False


_pickler: Any = None


def _pickler_class() -> Any:
    """cloudpickle's pickler, except that code keeps the file it came from.

    cloudpickle 3.1.3 renames the file of every function it stores by value to
    ``<dynamic-code>`` (for reproducible bytes); a task's remote traceback then shows neither the
    file nor the failing line. Skyward keeps the name: the worker's traceback points at the
    user's own source.

    Made on first use: cloudpickle (and the logging, inspect and platform it imports) costs a
    starting worker about 8 ms of CPU, and a worker needs it only for what it sends by value
    (an exception, a result that is a function); what it receives imports it as it loads.
    """
    global _pickler
    if _pickler is None:
        import cloudpickle

        class Pickler(cloudpickle.Pickler):
            def reducer_override(self, obj: Any) -> Any:
                if type(obj) is types.CodeType:
                    fn, args = cloudpickle.cloudpickle._code_reduce(obj)
                    return fn, tuple(obj.co_filename if a == "<dynamic-code>" else a for a in args)
                return super().reducer_override(obj)

        _pickler = Pickler
    return _pickler


def dumps_by_value(value: Any, buffer_callback: Any = None) -> bytes:
    """``cloudpickle.dumps(value, protocol=5)``, keeping functions' file names (see _pickler_class)."""
    out = io.BytesIO()
    _pickler_class()(out, protocol=5, buffer_callback=buffer_callback).dump(value)
    return out.getvalue()


def dumps_payload(value: Any) -> Payload:
    """Pickle ``value`` with protocol 5, keeping large buffers out of band (no copy).

    Plain data (numbers, strings, bytes, numpy arrays, and small containers of them) goes
    through the C pickler, several times faster than cloudpickle's set-up for a small value.
    """
    if value is None:  # (what most tasks without a result return: made once)
        return _NONE
    buffers: list[memoryview] = []

    def keep(buf: pickle.PickleBuffer) -> bool:
        view = buf.raw()
        if view.nbytes < 64 * 1024:
            return True  # small buffers are cheaper inline than as a frame part
        buffers.append(view)
        return False

    if is_plain(value):
        data = pickle.dumps(value, protocol=5, buffer_callback=keep)
    else:
        data = dumps_by_value(value, buffer_callback=keep)
    return Payload(data, buffers)


_NONE = Payload(pickle.dumps(None, protocol=5))


def loads_payload(parts: Sequence[Any]) -> Any:
    return pickle.loads(parts[0], buffers=parts[1:])
