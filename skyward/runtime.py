"""Helpers that user code calls inside a task: where am I, which data is mine, who may print.

Everything here also works outside a pool, where the caller is node 0 of 1. This module is
imported on workers, so it imports nothing heavy.
"""

from __future__ import annotations

import contextvars
import functools
import json
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, ParamSpec, TypeVar, overload

from skyward._shard import shard
from skyward.errors import ConfigError

__all__ = [
    "ENV_VAR",
    "InstanceInfo",
    "Peer",
    "instance_info",
    "shard",
    "silent",
    "stderr",
    "stdout",
]

#: The environment variable through which a pool tells each worker who it is (JSON).
ENV_VAR = "COMPUTE_POOL"

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Peer:
    """One node of the pool as seen from the others."""

    node: int
    addr: str


@dataclass(frozen=True, slots=True)
class InstanceInfo:
    """This node's place in the pool.

    ``head_addr``/``head_port`` is where node 0 can be reached by the other nodes (the
    rendezvous point frameworks such as torch.distributed use); ``peers`` lists every node
    with the address the others reach it on; ``accelerators`` is the number of accelerators
    (GPUs) on this node.
    """

    node: int = 0
    total_nodes: int = 1
    head_addr: str = "127.0.0.1"
    head_port: int = 29500
    accelerators: int = 0
    peers: tuple[Peer, ...] = field(default_factory=lambda: (Peer(0, "127.0.0.1"),))
    pool_id: str = ""

    @property
    def is_head(self) -> bool:
        return self.node == 0

    def to_json(self) -> str:
        return json.dumps(
            {
                "node": self.node,
                "total_nodes": self.total_nodes,
                "head_addr": self.head_addr,
                "head_port": self.head_port,
                "accelerators": self.accelerators,
                "peers": [{"node": p.node, "addr": p.addr} for p in self.peers],
                "pool_id": self.pool_id,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> InstanceInfo:
        data = json.loads(text)
        return cls(
            node=int(data["node"]),
            total_nodes=int(data["total_nodes"]),
            head_addr=str(data["head_addr"]),
            head_port=int(data["head_port"]),
            accelerators=int(data.get("accelerators", 0)),
            peers=tuple(Peer(int(p["node"]), str(p["addr"])) for p in data.get("peers", ())),
            pool_id=str(data.get("pool_id", "")),
        )


_cached: tuple[str | None, InstanceInfo] | None = None


def instance_info() -> InstanceInfo:
    """Return this node's :class:`InstanceInfo`.

    Read from the ``COMPUTE_POOL`` environment variable that the pool sets on every worker;
    outside a pool it describes a single node (node 0 of 1, the head).

    >>> info = instance_info()
    >>> info.node, info.total_nodes, info.is_head
    (0, 1, True)
    """
    global _cached
    raw = os.environ.get(ENV_VAR)
    cached = _cached
    if cached is not None and cached[0] == raw:
        return cached[1]
    if raw:
        try:
            info = InstanceInfo.from_json(raw)
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(ENV_VAR, "the JSON a ComputePool sets for its workers", raw) from exc
    else:
        info = InstanceInfo()
    _cached = (raw, info)
    return info


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
_sink: contextvars.ContextVar[Callable[[str, str], None] | None] = contextvars.ContextVar("skyward_sink", default=None)


class _Router:
    """A text stream that forwards to the current task's sink, drops silenced output, or
    falls through to the original stream."""

    def __init__(self, name: Stream, original: Any):
        self._name = name
        self._original = original

    def write(self, text: str) -> int:
        if self._name in _silenced.get():
            return len(text)
        sink = _sink.get()
        if sink is not None:
            sink(self._name, text)
            return len(text)
        return self._original.write(text)

    def flush(self) -> None:
        sink = _sink.get()
        if sink is not None:
            sink(self._name, "")
            return
        self._original.flush()

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self) -> str:
        return getattr(self._original, "encoding", "utf-8")

    def fileno(self) -> int:
        return self._original.fileno()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._original, name)


_router_lock = threading.Lock()


def _install_routers() -> None:
    """Make sure sys.stdout/sys.stderr are routers (idempotent, thread-safe)."""
    with _router_lock:
        if not isinstance(sys.stdout, _Router):
            sys.stdout = _Router("stdout", sys.stdout)
        if not isinstance(sys.stderr, _Router):
            sys.stderr = _Router("stderr", sys.stderr)


Only = Literal["head"] | Callable[[InstanceInfo], bool] | None


def _should_print(only: Only) -> bool:
    if only is None:
        return False
    if only == "head":
        return instance_info().is_head
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
        return _OutputControlled(fn, streams, only)  # type: ignore[return-value]

    return decorate


def stdout(only: Only = "head") -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Let only some nodes print to stdout while this task runs.

    ``only="head"`` keeps node 0's output; a predicate ``only=lambda info: info.node < 2``
    decides per node. Place it under ``@sky.compute``. Silencing covers this task only.
    """
    return _output_control(("stdout",), only)


def stderr(only: Only = "head") -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Like :func:`stdout`, for stderr."""
    return _output_control(("stderr",), only)


@overload
def silent(fn: Callable[P, R]) -> Callable[P, R]: ...
@overload
def silent(fn: None = None) -> Callable[[Callable[P, R]], Callable[P, R]]: ...
def silent(fn=None):
    """Suppress both stdout and stderr of this task on every node."""
    deco = _output_control(("stdout", "stderr"), None)
    return deco if fn is None else deco(fn)
