"""The messages and the frames: what travels between the client and a worker, and how.

A frame is a header followed by its parts::

    !I  number of parts (n >= 1)
    !Q  length of each part, n times
    ... the parts, back to back

Part 0 is a small pickled control message (a tuple whose first item is its kind, see
:class:`Kind`); a message that carries a payload (:mod:`skyward.protocol.payload`) sends it as
further parts. The same frames run over a local pipe or an SSH channel.

Writes of one frame are atomic with respect to other writers of the same stream (a lock);
reads happen on one thread per stream.
"""

from __future__ import annotations

import mmap
import pickle
import struct
import threading
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

if TYPE_CHECKING:
    from skyward.protocol.payload import Payload

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
    TASKS = "tasks"          # (TASKS, ((task_id, name, n_parts), ...)) + each task's payload parts in turn
    CANCEL = "cancel"        # (CANCEL, task_id)
    PING = "ping"            # (PING,)
    SHUTDOWN = "shutdown"    # (SHUTDOWN,)
    DETACH = "detach"        # (DETACH,) - a cluster's client leaves; its tasks end, the worker stays
    # worker -> client
    READY = "ready"          # (READY, pid)
    FATAL = "fatal"          # (FATAL, messages.Fatal) - the worker could not start
    OUTPUT = "output"        # (OUTPUT, task_id, stream, text, more) - a line, or a piece of one (more)
    RESULT = "result"        # (RESULT, task_id) + payload: the return value
    ERROR = "error"          # (ERROR, task_id, messages.RemoteFailure)
    REPLIES = "replies"      # (REPLIES, ((RESULT, task_id, n_parts) | (ERROR, task_id, failure), ...)) + parts
    HEARTBEAT = "heartbeat"  # (HEARTBEAT,)
    PREEMPT = "preempt"      # (PREEMPT, _preempt.Preemption) - a spot notice, once per kind
    BYE = "bye"              # (BYE,) - clean shutdown finished


#: The longest piece of a line of output a worker sends, in characters (OUTPUT: a longer line
#: goes in pieces, never cut, so a task printing one huge line cannot exhaust the worker's
#: memory nor the client's), and the longest line of the worker's own stderr the client
#: keeps, in bytes (the rest of such a line is cut and it ends with :func:`cut_marker`).
MAX_LINE = 64 * 1024


def cut_marker(cut: int, unit: str = "characters") -> str:
    """What ends a line that was cut: how much of it was."""
    return f" [... {cut} {unit} cut]"


class FrameWriter:
    """Writes frames to a binary stream; safe to share between threads."""

    def __init__(self, stream: BinaryIO):
        self._stream = stream
        self._lock = threading.Lock()

    def send(self, control: tuple, payload: Payload | None = None) -> None:
        head = pickle.dumps(control, protocol=5)
        if payload is None:  # (the usual frames first: one or two parts, one joined write)
            frame = _ONE.pack(1, len(head)) + head
        elif not payload.buffers and len(payload.data) < _SMALL_FRAME:
            frame = b"".join((_TWO.pack(2, len(head), len(payload.data)), head, payload.data))
        else:
            frame = None
        if frame is not None:
            with self._lock:
                self._stream.write(frame)
                self._stream.flush()
            return
        parts = [head, payload.data, *payload.buffers]
        sizes = [len(head), len(payload.data), *(memoryview(b).nbytes for b in payload.buffers)]
        count = len(parts)
        header = _layout(f"!I{count}Q").pack(count, *sizes)
        with self._lock:
            write = self._stream.write
            if (count <= 2 and sizes[-1] < _SMALL_FRAME) or sum(sizes) < _JOINED:  # one write
                write(b"".join((header, *parts)))
            else:
                write(header)
                for part in parts:
                    write(part)
            self._stream.flush()

    def try_send(self, control: tuple) -> bool:
        """Send a small message unless another thread is writing now (False: not sent). For
        messages that may be skipped (a ping): the caller never waits behind a large frame."""
        head = pickle.dumps(control, protocol=5)
        frame = _ONE.pack(1, len(head)) + head
        if not self._lock.acquire(blocking=False):
            return False
        try:
            self._stream.write(frame)
            self._stream.flush()
        finally:
            self._lock.release()
        return True

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
#: ... as it starts: it grows to _CHUNK when a read fills it (a busy stream). A client holds a
#: reader per worker, most of them quiet: a thousand full buffers were 64 MiB of its memory.
_FIRST_CHUNK = 4 * 1024


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
        self._buf = bytearray(_FIRST_CHUNK)
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
        if need > len(self._buf):
            self._grow()
        while self._hi < need:
            k = self._read(self._view[self._hi:])
            if not k:
                return False
            self._hi += k
            if self._hi == len(self._buf) < _CHUNK:  # a read filled it: more is coming this way
                self._grow()
        return True

    def _grow(self) -> None:
        """Take the full-size buffer, keeping what is unread (at the front: see _fill)."""
        buf = bytearray(_CHUNK)
        buf[:self._hi] = self._view[:self._hi]
        self._buf, self._view = buf, memoryview(buf)

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
        if self._hi - self._lo < _COUNT.size and not self._fill(_COUNT.size):  # (checks inlined)
            if self._hi > self._lo:
                raise EOFError("stream ended inside a frame header")
            return None
        (count,) = _COUNT.unpack_from(self._buf, self._lo)
        if not 1 <= count <= _MAX_PARTS:
            raise EOFError(f"corrupt frame header (parts={count})")
        head = _COUNT.size + _LEN.size * count
        if head <= _CHUNK:
            if self._hi - self._lo < head and not self._fill(head):
                raise EOFError("stream ended inside a frame header")
            layout = _LENS[count] if count < 3 else _layout(f"!{count}Q")
            lens = layout.unpack_from(self._buf, self._lo + _COUNT.size)
            self._lo += head
        else:  # a frame with thousands of buffers
            self._lo += _COUNT.size
            lens = _layout(f"!{count}Q").unpack(self._take(head - _COUNT.size))
        self.received += head + sum(lens)
        first = lens[0]
        # The control part, unpickled in place.
        if first <= _CHUNK and (self._hi - self._lo >= first or self._fill(first)):
            control = pickle.loads(self._view[self._lo:self._lo + first])
            self._lo += first
        else:
            control = pickle.loads(self._take(first))
        parts = []
        for n in lens[1:]:
            lo = self._lo
            if self._hi - lo >= n:  # (the usual small part, read along with its header: a copy)
                parts.append(self._buf[lo:lo + n])
                self._lo = lo + n
            else:
                parts.append(self._take(n))
        return control, parts


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


#: Frames whose payload pickle is smaller than this are joined and written in one call.
_SMALL_FRAME = 16 * 1024
#: ... and a frame of many small parts up to this size (a batch of tasks or of answers): one
#: copy costs less than a write a part.
_JOINED = 1 << 20


def _layout(fmt: str) -> struct.Struct:
    """A compiled struct per format (frame headers come in a few part counts)."""
    s = _STRUCTS.get(fmt)
    if s is None:
        s = _STRUCTS[fmt] = struct.Struct(fmt)
    return s


_STRUCTS: dict[str, struct.Struct] = {}
#: The headers of the usual frames (a control part, and a payload), made once.
_ONE, _TWO = _layout("!IQ"), _layout("!I2Q")
_LENS = (None, _layout("!Q"), _layout("!2Q"))
