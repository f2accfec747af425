"""The framed protocol spoken between the client and a worker over one byte stream.

A frame is a header followed by its parts::

    !I  number of parts (n >= 1)
    !Q  length of each part, n times
    ... the parts, back to back

Part 0 is a small pickled control message (a tuple whose first item is its kind, see
``Kind``). A message that carries a payload (a task or a result) sends it as further parts:
part 1 is a protocol-5 pickle and parts 2.. are its out-of-band buffers, so a large numpy
array or torch tensor goes over the stream as its own bytes without being copied into the
pickle. The same frames run over a local pipe or an SSH channel.

Writes of one frame are atomic with respect to other writers of the same stream (a lock);
reads happen on one thread per stream.
"""

from __future__ import annotations

import pickle
import struct
import threading
from collections.abc import Sequence
from typing import Any, BinaryIO, Protocol

import cloudpickle

__all__ = ["Kind", "Payload", "FrameReader", "FrameWriter", "dumps_payload", "loads_payload"]

_COUNT = struct.Struct("!I")
_LEN = struct.Struct("!Q")
#: A frame with more parts than this is corrupt (protects against reading garbage).
_MAX_PARTS = 1 << 20


class Kind:
    """Message kinds (part 0 is ``(kind, ...)``)."""

    # client -> worker
    SETUP = "setup"          # (SETUP, settings dict) + payload: the plugins
    TASK = "task"            # (TASK, task_id, name) + payload: (fn, args, kwargs)
    CANCEL = "cancel"        # (CANCEL, task_id)
    PING = "ping"            # (PING,)
    SHUTDOWN = "shutdown"    # (SHUTDOWN,)
    # worker -> client
    READY = "ready"          # (READY, pid)
    FATAL = "fatal"          # (FATAL, error dict) - the worker could not start
    OUTPUT = "output"        # (OUTPUT, task_id, stream, text)
    RESULT = "result"        # (RESULT, task_id) + payload: the return value
    ERROR = "error"          # (ERROR, task_id, error dict)
    HEARTBEAT = "heartbeat"  # (HEARTBEAT,)
    BYE = "bye"              # (BYE,) - clean shutdown finished


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


def dumps_payload(value: Any) -> Payload:
    """Pickle ``value`` with protocol 5, keeping large buffers out of band (no copy)."""
    buffers: list[memoryview] = []

    def keep(buf: pickle.PickleBuffer) -> bool:
        view = buf.raw()
        if view.nbytes < 64 * 1024:
            return True  # small buffers are cheaper inline than as a frame part
        buffers.append(view)
        return False

    data = cloudpickle.dumps(value, protocol=5, buffer_callback=keep)
    return Payload(data, buffers)


def loads_payload(parts: Sequence[Any]) -> Any:
    return pickle.loads(parts[0], buffers=parts[1:])


class FrameWriter:
    """Writes frames to a binary stream; safe to share between threads."""

    def __init__(self, stream: BinaryIO):
        self._stream = stream
        self._lock = threading.Lock()

    def send(self, control: tuple, payload: Payload | None = None) -> None:
        head = pickle.dumps(control, protocol=5)
        parts: list[Any] = [head] if payload is None else [head, *payload.parts]
        header = bytearray(_COUNT.pack(len(parts)))
        for part in parts:
            header += _LEN.pack(memoryview(part).nbytes)
        with self._lock:
            write = self._stream.write
            write(header)
            for part in parts:
                write(part)
            self._stream.flush()

    def close(self) -> None:
        with self._lock:
            try:
                self._stream.close()
            except OSError:
                pass


class _Readable(Protocol):
    def readinto(self, b: Any, /) -> int | None: ...


class FrameReader:
    """Reads frames from a binary stream. ``recv`` returns ``None`` at a clean end of stream."""

    def __init__(self, stream: _Readable):
        self._stream = stream

    def _read_exact(self, n: int) -> bytearray | None:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = self._stream.readinto(view[got:])
            if not k:
                if got == 0:
                    return None
                raise EOFError(f"stream ended inside a frame ({got} of {n} bytes)")
            got += k
        return buf

    def recv(self) -> tuple[tuple, list[bytearray]] | None:
        """Return ``(control, payload_parts)``; payload_parts is empty for plain messages."""
        raw = self._read_exact(_COUNT.size)
        if raw is None:
            return None
        (count,) = _COUNT.unpack(raw)
        if not 1 <= count <= _MAX_PARTS:
            raise EOFError(f"corrupt frame header (parts={count})")
        lens = self._read_exact(_LEN.size * count)
        if lens is None:
            raise EOFError("stream ended inside a frame header")
        parts: list[bytearray] = []
        for i in range(count):
            (length,) = _LEN.unpack_from(lens, i * _LEN.size)
            part = self._read_exact(length) if length else bytearray()
            if part is None:
                raise EOFError("stream ended inside a frame")
            parts.append(part)
        control = pickle.loads(parts[0])
        return control, parts[1:]
