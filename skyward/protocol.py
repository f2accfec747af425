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

import io
import mmap
import os
import pickle
import resource
import select
import struct
import threading
import time
import types
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

    # Every frame's layout is listed here. Hot-path frames are small tuples; the structured
    # ones carry a frozen dataclass of skyward.messages.
    # client -> worker (SETUP first, always: nothing else is written before it)
    SETUP = "setup"          # (SETUP, messages.Setup) + payload: the plugins
    TASK = "task"            # (TASK, task_id, name) + payload: (fn, args, kwargs)
    CANCEL = "cancel"        # (CANCEL, task_id)
    PING = "ping"            # (PING,)
    SHUTDOWN = "shutdown"    # (SHUTDOWN,)
    # worker -> client
    READY = "ready"          # (READY, pid)
    FATAL = "fatal"          # (FATAL, messages.Fatal) - the worker could not start
    OUTPUT = "output"        # (OUTPUT, task_id, stream, text)
    RESULT = "result"        # (RESULT, task_id) + payload: the return value
    ERROR = "error"          # (ERROR, task_id, messages.RemoteFailure)
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


#: Types the C pickler stores by value, exactly as cloudpickle would.
_PLAIN = frozenset({type(None), bool, int, float, complex, str, bytes, bytearray, range, slice})


def _plain(value: Any, depth: int = 0) -> bool:
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
        return not value or (len(value) <= 64 and all(_plain(v, depth + 1) for v in value))
    if t is dict:
        return not value or len(value) <= 64 and all(_plain(k, depth + 1) and _plain(v, depth + 1) for k, v in value.items())
    if t.__name__ == "ndarray" and t.__module__ == "numpy":
        return not value.dtype.hasobject
    return False


class _Pickler(cloudpickle.Pickler):
    """cloudpickle's pickler, except that code keeps the file it came from.

    cloudpickle 3.1.3 renames the file of every function it stores by value to
    ``<dynamic-code>`` (for reproducible bytes); a task's remote traceback then shows neither the
    file nor the failing line. Skyward keeps the name: the worker's traceback points at the
    user's own source.
    """

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is types.CodeType:
            fn, args = cloudpickle.cloudpickle._code_reduce(obj)
            return fn, tuple(obj.co_filename if a == "<dynamic-code>" else a for a in args)
        return super().reducer_override(obj)


def dumps_by_value(value: Any, buffer_callback: Any = None) -> bytes:
    """``cloudpickle.dumps(value, protocol=5)``, keeping functions' file names (see _Pickler)."""
    out = io.BytesIO()
    _Pickler(out, protocol=5, buffer_callback=buffer_callback).dump(value)
    return out.getvalue()


def dumps_payload(value: Any) -> Payload:
    """Pickle ``value`` with protocol 5, keeping large buffers out of band (no copy).

    Plain data (numbers, strings, bytes, numpy arrays, and small containers of them) goes
    through the C pickler, several times faster than cloudpickle's set-up for a small value.
    """
    buffers: list[memoryview] = []

    def keep(buf: pickle.PickleBuffer) -> bool:
        view = buf.raw()
        if view.nbytes < 64 * 1024:
            return True  # small buffers are cheaper inline than as a frame part
        buffers.append(view)
        return False

    if _plain(value):
        data = pickle.dumps(value, protocol=5, buffer_callback=keep)
    else:
        data = dumps_by_value(value, buffer_callback=keep)
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
        if payload is None:
            parts: list[Any] = [head]
            sizes = [len(head)]
        else:
            parts = [head, payload.data, *payload.buffers]
            sizes = [len(head), len(payload.data), *(memoryview(b).nbytes for b in payload.buffers)]
        count = len(parts)
        header = _layout(f"!I{count}Q").pack(count, *sizes)
        with self._lock:
            write = self._stream.write
            if count <= 2 and sizes[-1] < _SMALL_FRAME:  # one write of the whole frame
                write(b"".join((header, *parts)))
            else:
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


#: The reader's own buffer: small frames are parsed from it in place, so a control message
#: costs one ``read`` system call however many fields its header has.
_CHUNK = 64 * 1024


class FrameReader:
    """Reads frames from a binary stream. ``recv`` returns ``None`` at a clean end of stream.

    The reader buffers on its own (give it a raw, unbuffered stream where there is one), so
    :meth:`buffered` can tell whether a frame may already be waiting without a system call: a
    caller that polls the stream's file descriptor must first check that.
    """

    def __init__(self, stream: _Readable):
        self._stream = stream
        # Bytes a stream took from its source but has not handed over yet (an SSH channel's
        # reader): the source's fd cannot show them, so ``buffered`` counts them.
        self._held = getattr(stream, "pending", None)
        # One system call's worth at most: a buffered stream's readinto() would wait to fill
        # the whole buffer.
        self._read = getattr(stream, "readinto1", stream.readinto)
        self._buf = bytearray(_CHUNK)
        self._view = memoryview(self._buf)
        self._lo = 0  # the unread bytes are _buf[_lo:_hi]
        self._hi = 0
        #: Bytes of the frames read so far (headers included).
        self.received = 0

    def buffered(self) -> int:
        """Bytes readable without waiting (here, or held by the stream)."""
        held = self._held
        return self._hi - self._lo + (held() if held is not None else 0)

    def _fill(self, need: int) -> bool:
        """Have at least ``need`` (<= _CHUNK) bytes buffered; False at end of stream."""
        if self._hi - self._lo >= need:
            return True
        if self._lo:  # move the unread tail to the front
            n = self._hi - self._lo
            self._buf[:n] = self._view[self._lo:self._hi]
            self._lo, self._hi = 0, n
        while self._hi < need:
            k = self._read(self._view[self._hi:])
            if not k:
                return False
            self._hi += k
        return True

    def _take(self, n: int) -> bytearray:
        """The next ``n`` bytes as a buffer of their own (large ones read straight into it)."""
        out = _buffer(n)
        have = min(n, self._hi - self._lo)
        if have:
            out[:have] = self._view[self._lo:self._lo + have]
            self._lo += have
        if have < n:
            view = memoryview(out)
            got = have
            while got < n:
                k = self._stream.readinto(view[got:])
                if not k:
                    raise EOFError(f"stream ended inside a frame ({got} of {n} bytes)")
                got += k
        return out

    def recv(self) -> tuple[tuple, list[bytearray]] | None:
        """Return ``(control, payload_parts)``; payload_parts is empty for plain messages."""
        if not self._fill(_COUNT.size):
            if self._hi > self._lo:
                raise EOFError("stream ended inside a frame header")
            return None
        (count,) = _COUNT.unpack_from(self._buf, self._lo)
        if not 1 <= count <= _MAX_PARTS:
            raise EOFError(f"corrupt frame header (parts={count})")
        head = _COUNT.size + _LEN.size * count
        if head <= _CHUNK:
            if not self._fill(head):
                raise EOFError("stream ended inside a frame header")
            lens = _layout(f"!{count}Q").unpack_from(self._buf, self._lo + _COUNT.size)
            self._lo += head
        else:  # a frame with thousands of buffers
            self._lo += _COUNT.size
            lens = _layout(f"!{count}Q").unpack(self._take(head - _COUNT.size))
        self.received += head + sum(lens)
        first = lens[0]
        if first <= _CHUNK and self._fill(first):  # the control part, unpickled in place
            control = pickle.loads(self._view[self._lo:self._lo + first])
            self._lo += first
        else:
            control = pickle.loads(self._take(first))
        return control, [self._take(n) for n in lens[1:]]


#: Parts from this size on are received into memory mapped and populated in one go.
_BIG_PART = 1 << 20
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def _buffer(n: int) -> Any:
    """A writable buffer of ``n`` bytes to receive into.

    ``bytearray(n)`` zero-fills its memory, and fresh memory then costs a page fault per 4 KiB
    on first touch: for a large part that is more than the copy out of the pipe. An anonymous
    mapping with MAP_POPULATE gets its pages (already zeroed by the kernel) in one system call
    and skips the fill (measured: 512 MiB allocated and filled in 190 ms instead of 234 ms).
    """
    if n >= _BIG_PART and _POPULATE:
        try:
            return mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _POPULATE)
        except OSError:
            pass
    return bytearray(n)


#: How long a reader that is about to block keeps polling for the next frame first, unless the
#: environment says otherwise (``SKYWARD_SPIN_US``, microseconds; 0 turns it off).
SPIN_ENV = "SKYWARD_SPIN_US"
DEFAULT_SPIN_US = 50


def spin_from_env() -> float:
    """The spin window in seconds from ``SKYWARD_SPIN_US`` (ConfigError if it is not a count)."""
    raw = os.environ.get(SPIN_ENV, "").strip()
    if not raw:
        return DEFAULT_SPIN_US / 1e6
    try:
        us = int(raw)
    except ValueError:
        us = -1
    if us < 0:
        from skyward.errors import ConfigError

        raise ConfigError(SPIN_ENV, "a whole number of microseconds, 0 or more", raw)
    return us / 1e6


def spinner(fd: int, seconds: float) -> Any:
    """A function that polls ``fd`` without sleeping for up to ``seconds``; None if 0.

    Falling asleep in a blocking read and being woken costs, on a small VM, more than a whole
    round trip (the idle CPU must be woken, then the caches are cold): a reader that expects an
    answer soon is better off polling for it for a few tens of microseconds first. A poll with
    timeout 0 releases the GIL, so other threads still run. Polling backs off by itself where it
    does not pay (long tasks, busy CPUs) and is off with a single CPU.
    """
    if seconds <= 0 or _cpus() < 2:
        return None  # with one CPU, polling only keeps the writer we wait for from running
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    clock = time.perf_counter
    yield_cpu = getattr(os, "sched_yield", lambda: None)
    # Back off when polling does not pay: the answers take longer than the window, or the CPUs
    # are busy with other work (then our polling takes the CPU the writer needs). After each
    # poll that came up empty, the next 1, 2, 4, ... up to _MAX_SKIP waits block at once (a small
    # cap: the processes may move to CPUs of their own again, and polling should resume soon).
    # A poll that succeeds but had this thread preempted meanwhile counts as not paying too:
    # the CPUs are contended, and our polling delays the writer.
    skip = backoff = 0
    preempted = _preemptions()

    def spin() -> bool:
        nonlocal skip, backoff, preempted
        if skip:
            skip -= 1
            return False
        end = clock() + seconds
        got = True
        while not poller.poll(0):
            if clock() >= end:
                got = False
                break
            yield_cpu()  # if the writer shares this CPU, let it run
        now = _preemptions()
        if got and now == preempted:
            backoff = 0
        else:
            backoff = min(backoff * 2 or 1, _MAX_SKIP)
            skip = backoff
        preempted = now
        return got

    return spin


def _preemptions() -> int:
    """How many times the CPU was taken from this thread (0 where that cannot be read)."""
    if _RUSAGE_THREAD is None:
        return 0
    return resource.getrusage(_RUSAGE_THREAD).ru_nivcsw


_MAX_SKIP = 16
_RUSAGE_THREAD = getattr(resource, "RUSAGE_THREAD", None)


def _cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


#: Frames whose payload pickle is smaller than this are joined and written in one call.
_SMALL_FRAME = 16 * 1024


def _layout(fmt: str) -> struct.Struct:
    """A compiled struct per format (frame headers come in a few part counts)."""
    s = _STRUCTS.get(fmt)
    if s is None:
        s = _STRUCTS[fmt] = struct.Struct(fmt)
    return s


_STRUCTS: dict[str, struct.Struct] = {}
