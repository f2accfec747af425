"""Who may print: :func:`stdout`, :func:`stderr` and :func:`silent` (re-exported by
:mod:`skyward.runtime`), and the router that sends a task's writes to its own sink.

Imported on workers: nothing heavy.
"""

from __future__ import annotations

import codecs
import contextvars
import functools
import io
import sys
import threading
from collections.abc import Callable
from typing import Any, Literal, ParamSpec, TypeVar, overload

from skyward.errors import ConfigError
from skyward.runtime.instance import InstanceInfo, instance_info

__all__ = ["Router", "no_terminal_breakpoint", "silent", "stderr", "stdout", "task_sink"]

P = ParamSpec("P")
R = TypeVar("R")


# ---------------------------------------------------------------------------------------------
# Output control.
#
# sys.stdout / sys.stderr are replaced (once) by a router that looks at a context variable to
# decide where each write goes. A context variable rather than a global swap is what lets two
# tasks running concurrently on one node silence themselves without silencing each other.

Stream = Literal["stdout", "stderr"]

#: Per-task (per-context) set of silenced streams.
_silenced: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar("skyward_silenced", default=frozenset())
#: Per-task sink: ``sink(stream, text)`` receives the task's output (set by the worker).
task_sink: contextvars.ContextVar[Callable[[str, str], None] | None] = contextvars.ContextVar("skyward_sink", default=None)


class _SharedStream:
    """What a task's stdout/stderr (text or binary) say of themselves: an open, writable,
    non-terminal stream that ``close`` only flushes (the worker's tasks share it)."""

    def close(self) -> None:
        try:
            self.flush()  # type: ignore[attr-defined]
        except Exception:
            pass

    @property
    def closed(self) -> bool:
        return False

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True


class Router(_SharedStream, io.TextIOBase):
    """A text stream that forwards to the current task's sink, drops silenced output, or
    falls through to the original stream.

    A complete text file object, as code that inspects ``sys.stdout`` expects: ``closed``
    (False: a task cannot close the stream the worker's other tasks share, so ``close()``
    only flushes), ``encoding`` (utf-8 unless the original says otherwise), ``isatty()``
    (False), ``fileno()`` (the original's descriptor), ``buffer`` (a binary stream whose
    bytes, decoded as UTF-8, go the same way as text), ``writable()``...
    """

    def __init__(self, name: Stream, original: Any):
        super().__init__()
        self._name = name
        self._original = original
        self._buffer: _BinaryRouter | None = None

    def write(self, text: str) -> int:
        if self._name in _silenced.get():
            return len(text)
        sink = task_sink.get()
        if sink is not None:
            sink(self._name, text)
            return len(text)
        return self._original.write(text)

    def flush(self) -> None:
        sink = task_sink.get()
        if sink is not None:
            sink(self._name, "")
            return
        self._original.flush()

    def writelines(self, lines) -> None:  # type: ignore[override]
        for line in lines:
            self.write(line)

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    @property
    def name(self) -> str:
        return f"<{self._name}>"

    @property
    def mode(self) -> str:
        return "w"

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._original, "encoding", None) or "utf-8"

    @property
    def errors(self) -> str:  # type: ignore[override]
        return getattr(self._original, "errors", None) or "strict"

    @property
    def line_buffering(self) -> bool:
        return True

    @property
    def buffer(self) -> _BinaryRouter:  # type: ignore[override]
        if self._buffer is None:
            self._buffer = _BinaryRouter(self)
        return self._buffer

    def fileno(self) -> int:
        return self._original.fileno()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._original, name)


class _BinaryRouter(_SharedStream, io.BufferedIOBase):
    """``sys.stdout.buffer`` on a worker: bytes, decoded as UTF-8 (a character split across
    writes is kept whole), written to the text router."""

    def __init__(self, text: Router):
        super().__init__()
        self._text = text
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._lock = threading.Lock()

    def write(self, data: Any) -> int:  # type: ignore[override]
        view = memoryview(data)
        with self._lock:
            text = self._decoder.decode(bytes(view))
        if text:
            self._text.write(text)
        return view.nbytes

    def flush(self) -> None:
        self._text.flush()

    def fileno(self) -> int:
        return self._text.fileno()

    @property
    def raw(self) -> Any:
        return self


_router_lock = threading.Lock()


def _install_routers() -> None:
    """Make sure sys.stdout/sys.stderr are routers (idempotent, thread-safe)."""
    with _router_lock:
        if not isinstance(sys.stdout, Router):
            sys.stdout = Router("stdout", sys.stdout)
        if not isinstance(sys.stderr, Router):
            sys.stderr = Router("stderr", sys.stderr)


Only = Literal["head"] | Callable[[InstanceInfo], bool] | None


def _should_print(only: Only) -> bool:
    if only is None:
        return False
    if only == "head":
        return instance_info().rank == 0  # one copy: node 0's first process
    if callable(only):
        return bool(only(instance_info()))
    raise ConfigError("only", '"head", a predicate taking an InstanceInfo, or None', only)


def _check_only(only: object) -> None:
    if not (only is None or only == "head" or callable(only)):
        raise ConfigError("only", '"head", a predicate taking an InstanceInfo, or None', only)


class _OutputControlled:
    """A task function whose chosen streams are silenced unless ``only`` lets this node print.

    A class (not a closure) so that it pickles by reference to this module: a closure would be
    pickled by value, dragging the module's context variables along.
    """

    def __init__(self, fn: Callable[..., Any], streams: tuple[Stream, ...], only: Only):
        self.fn = fn
        self.streams = frozenset(streams)
        self.only = only
        functools.update_wrapper(self, fn, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _should_print(self.only):
            return self.fn(*args, **kwargs)
        _install_routers()
        token = _silenced.set(_silenced.get() | self.streams)
        try:
            return self.fn(*args, **kwargs)
        finally:
            _silenced.reset(token)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_OutputControlled, (self.fn, tuple(self.streams), self.only))


def _output_control(streams: tuple[Stream, ...], only: Only) -> Callable[[Callable[P, R]], Callable[P, R]]:
    _check_only(only)

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        from skyward.compute import ComputeFunction

        if isinstance(fn, ComputeFunction):
            # Placed above @sky.compute: wrapping the lazy function would control the client's
            # output while it builds the call, i.e. nothing. Apply it to the task itself.
            inner = _OutputControlled(fn.fn, streams, only)
            return ComputeFunction(inner, name=fn.options.name, timeout=fn.options.timeout)  # type: ignore[return-value]
        return _OutputControlled(fn, streams, only)  # type: ignore[return-value]

    return decorate


def stdout(only: Only = "head") -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Let only some nodes print to stdout while this task runs.

    ``only="head"`` keeps the output of rank 0 (node 0's first worker process); a predicate
    ``only=lambda info: info.node < 2`` decides per process. Place it under ``@sky.compute``
    (placed above, it is applied to the task all the same). Silencing covers this task only.
    """
    return _output_control(("stdout",), only)


def stderr(only: Only = "head") -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Let only some nodes print to stderr while this task runs; the same rules as :func:`stdout`.

    Example:
        >>> @sky.compute
        ... @sky.stderr(only="head")      # warnings from node 0 only
        ... def fit() -> None: ...
    """
    return _output_control(("stderr",), only)


@overload
def silent(fn: Callable[P, R]) -> Callable[P, R]: ...
@overload
def silent(fn: None = None) -> Callable[[Callable[P, R]], Callable[P, R]]: ...
def silent(fn=None):
    """Suppress both stdout and stderr of this task on every node; results still come back.

    Usable bare or called: ``@sky.silent`` and ``@sky.silent()`` are the same. Place it under
    ``@sky.compute``.
    """
    deco = _output_control(("stdout", "stderr"), None)
    return deco if fn is None else deco(fn)


def no_terminal_breakpoint(*args: Any, **kwargs: Any) -> None:
    """``breakpoint()`` inside a task (the pool sets ``PYTHONBREAKPOINT`` to this on workers)."""
    node = instance_info().node
    raise RuntimeError(
        f"breakpoint() in a task on node {node}: a task runs in a worker process with no terminal "
        "(its stdin and stdout carry the pool's protocol), so there is nobody to type to the debugger. "
        "Debug the function here with f.local(...), or point PYTHONBREAKPOINT in the pool's image env "
        "at a remote debugger (e.g. Image(env={'PYTHONBREAKPOINT': 'remote_pdb.set_trace'}))"
    )
