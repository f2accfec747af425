"""Lazy computations: ``@sky.compute`` and the operators that send them to a pool.

``f(*args)`` on a ``@sky.compute`` function runs nothing: it returns a frozen, picklable
:class:`PendingCompute` that remembers the call. An operator then decides where it runs:

=========================  ========================================  =======================
expression                 meaning                                   returns
=========================  ========================================  =======================
``p >> pool``              run on one node (the least busy)          ``T``
``p @ pool``               run on every node                         ``list[T]`` by node
``p1 & p2`` then ``>>``    run concurrently across the pool          ``tuple`` in input order
``gather(*ps) >> pool``    run concurrently across the pool          ``list`` in input order
``p > pool``               submit, don't wait                        ``Future[T]``
``f.local(*a)``            run here, now                             ``T``
=========================  ========================================  =======================

Mind Python's precedence: ``>>`` binds tighter than ``&``, so write ``(p1 & p2) >> pool``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, Protocol, TypeVar, overload

from skyward.errors import ConfigError, SerializationError
from skyward.protocol import Payload, dumps_by_value, dumps_payload

if TYPE_CHECKING:
    from concurrent.futures import Future

__all__ = ["ComputeFunction", "PendingCompute", "PendingGather", "compute", "gather"]

P = ParamSpec("P")
T = TypeVar("T")


class Pool(Protocol):
    """What the operators ask of their right-hand side: :class:`skyward.ComputePool` is one.

    The operators know a pool only through these four methods, so this module does not import
    the pool (which is built on it): any object whose type has them is accepted (see
    :func:`_pool`), anything else is refused with a :class:`~skyward.ConfigError`.
    """

    def run(self, pending: PendingCompute[T], /) -> T: ...
    def broadcast(self, pending: PendingCompute[T], /) -> list[T]: ...
    def submit(self, pending: PendingCompute[T], /) -> Future[T]: ...
    def gather(self, *pending: PendingCompute[Any], stream: bool = False, ordered: bool = True) -> Any: ...


@dataclass(frozen=True, slots=True)
class TaskOptions:
    name: str
    timeout: float | None = None
    #: A broadcast runs it once per node (on each node's first worker process), not once per
    #: process: a shell command such as torchrun starts the node's processes itself.
    per_node: bool = False
    #: Times a task whose node was lost is run again on another node (``@sky.compute(retries=N)``).
    retries: int = 0


@dataclass(frozen=True, eq=False)
class PendingCompute(Generic[T]):
    """A call that has not run yet. Frozen and picklable; send it to a pool with an operator.

    | expression | runs | returns |
    | --- | --- | --- |
    | `p >> pool` | on one node, the least busy | `T` |
    | `p @ pool` | on every node | `list[T]`, ordered by node |
    | `p > pool` | on one node, without waiting | `concurrent.futures.Future[T]` |
    | `p1 & p2 >> pool` | concurrently | a tuple, in input order |
    | `p.local()` | here, now | `T` |

    The type parameter survives the operator: for a ``PendingCompute[float]``, ``p >> pool``
    is a ``float`` to a type checker.

    Example:
        >>> @sky.compute
        ... def square(x: int) -> int:
        ...     return x * x
        >>> p = square(3)                  # nothing runs yet
        >>> p.local()
        9
    """

    fn: Callable[..., T]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    options: TaskOptions = field(default_factory=lambda: TaskOptions("task"))

    @property
    def name(self) -> str:
        """The task's name (the function's, or ``@sky.compute(name=...)``): shown in events."""
        return self.options.name

    def payload(self) -> Payload:
        """Serialize the call for a worker; name the argument at fault when one can't be.

        The function travels as its own pickle, made once per function object (workers keep the
        unpickled function by those bytes too); a call without arguments is made once, whole.
        """
        bare = not self.args and not self.kwargs
        if bare and self.fn in _bare_payloads:
            return _bare_payloads[self.fn]
        _reject_open_files(self)
        try:
            made = dumps_payload((function_blob(self.fn), self.args, self.kwargs))
        except Exception as exc:
            raise _explain_unpicklable(self, exc) from exc
        if bare:
            with contextlib.suppress(TypeError):  # not weak-referenceable (a builtin): not kept
                _bare_payloads[self.fn] = made
        return made

    def local(self) -> T:
        """Run here and now."""
        return self.fn(*self.args, **self.kwargs)

    def with_options(self, *, retries: int | None = None, timeout: float | None = None) -> PendingCompute[T]:
        """This call with other task options (for this call only; the function keeps its own).

        >>> @sky.compute
        ... def step(i: int) -> int:
        ...     return i
        >>> step(1).with_options(retries=2).options.retries
        2

        ``retries``: times the call runs again on another node when its node is lost (see
        ``@sky.compute``); ``timeout``: seconds, as there. Raises ConfigError for bad values.
        """
        changes: dict[str, Any] = {}
        if retries is not None:
            changes["retries"] = _checked_retries(retries)
        if timeout is not None:
            changes["timeout"] = _checked_timeout(timeout)
        return dataclasses.replace(self, options=dataclasses.replace(self.options, **changes))

    def __reduce__(self) -> tuple[Any, ...]:
        # The decorated function is usually not reachable by its name (the name now holds the
        # ComputeFunction), so plain pickle can't store it by reference: use cloudpickle.
        state = dumps_by_value((self.fn, self.args, self.kwargs, self.options))
        return (_rebuild_pending, (state,))

    # -- operators ---------------------------------------------------------------------------
    def __rshift__(self, pool: Pool) -> T:
        return _pool(pool, ">>").run(self)

    def __matmul__(self, pool: Pool) -> list[T]:
        return _pool(pool, "@").broadcast(self)

    def __gt__(self, pool: Pool) -> Future[T]:  # type: ignore[override]
        return _pool(pool, ">").submit(self)

    def __and__(self, other: PendingCompute[Any] | PendingGather) -> PendingGather:
        return PendingGather((self,)) & other

    def __repr__(self) -> str:
        return f"<PendingCompute {self.options.name}(...)>"

    # -- not a value yet: arithmetic, truth and iteration say so instead of guessing ------------
    # (At run time only: to a type checker these operations stay undefined, so it flags them.)
    if not TYPE_CHECKING:

        def _not_computed(self, *_):
            raise TypeError(
                f"{self!r} has not been computed yet: run it first, e.g. `result = {self.options.name}(...) >> pool` "
                f"(or `@ pool` for every node, `.local()` here), then use the result"
            )

        __bool__ = __iter__ = __len__ = __float__ = __int__ = __index__ = _not_computed
        __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _not_computed
        __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = __pow__ = __rpow__ = __neg__ = __abs__ = _not_computed
        __lt__ = __le__ = __ge__ = __getitem__ = _not_computed


@dataclass(frozen=True, eq=False)
class PendingGather:
    """Several pending calls to run concurrently. ``>> pool`` runs them.

    Built by ``p1 & p2`` (gives a tuple) or :func:`gather` (a list, or an iterator when
    ``stream=True``).
    """

    items: tuple[PendingCompute[Any], ...]
    as_tuple: bool = True
    stream: bool = False
    ordered: bool = True

    def __and__(self, other: PendingCompute[Any] | PendingGather) -> PendingGather:
        if isinstance(other, PendingGather):
            more = other.items
        elif isinstance(other, PendingCompute):
            more = (other,)
        else:
            raise ConfigError("&", "a pending computation (a call of a @sky.compute function)", _describe(other))
        return PendingGather(self.items + more, as_tuple=True)

    def __rshift__(self, pool: Pool) -> Any:
        results = _pool(pool, ">>").gather(*self.items, stream=self.stream, ordered=self.ordered)
        if self.stream:
            return results
        return tuple(results) if self.as_tuple else list(results)

    def __len__(self) -> int:
        return len(self.items)


def gather(*pending: PendingCompute[Any], stream: bool = False, ordered: bool = True) -> PendingGather:
    """Group pending calls to run concurrently: ``sky.gather(a(), b()) >> pool``.

    Gives a list in input order, or with ``stream=True`` an iterator that yields results as
    they become available (in input order, or in completion order with ``ordered=False``).
    """
    for i, p in enumerate(pending):
        if not isinstance(p, PendingCompute):
            raise ConfigError(
                f"gather() argument {i}", "a pending computation (a call of a @sky.compute function)", _describe(p)
            )
    return PendingGather(tuple(pending), as_tuple=False, stream=bool(stream), ordered=bool(ordered))


class ComputeFunction(Generic[P, T]):
    """A function made lazy by ``@sky.compute``. Calling it returns a :class:`PendingCompute`.

    The signature is kept (``ParamSpec``): type checkers see the original parameters, and
    ``f(...)`` is a ``PendingCompute`` of the original return type. ``f.local(...)`` calls
    the function itself; ``f.fn`` is the undecorated function.
    """

    def __init__(self, fn: Callable[P, T], *, name: str | None = None, timeout: float | None = None,
                 retries: int = 0):
        if not callable(fn):
            raise ConfigError("compute", "a function", fn)
        if timeout is not None:
            timeout = _checked_timeout(timeout)
        if name is not None and (not isinstance(name, str) or not name):
            raise ConfigError("name", "a non-empty string or None", name)
        self.fn = fn
        self.options = TaskOptions(name or getattr(fn, "__name__", "task"), timeout,
                                   retries=_checked_retries(retries))
        functools.update_wrapper(self, fn, updated=())  # type: ignore[arg-type]

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> PendingCompute[T]:
        return PendingCompute(self.fn, args, kwargs, self.options)

    def local(self, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run here and now, like calling the undecorated function."""
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<sky.compute {self.options.name}>"


def _checked_timeout(timeout: Any) -> float:
    if (not isinstance(timeout, (int, float)) or isinstance(timeout, bool)
            or not 0 < timeout < float("inf")):  # nan fails both comparisons
        raise ConfigError("timeout", "a positive number of seconds (not inf or nan) or None", timeout)
    return float(timeout)


def _checked_retries(retries: Any) -> int:
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        raise ConfigError("retries", "an integer >= 0 (times a task runs again when its node is lost)", retries)
    return retries


@overload
def compute(fn: Callable[P, T], /) -> ComputeFunction[P, T]: ...
@overload
def compute(*, name: str | None = None, timeout: float | None = None,
            retries: int = 0) -> Callable[[Callable[P, T]], ComputeFunction[P, T]]: ...
def compute(fn: Any = None, /, *, name: str | None = None, timeout: float | None = None, retries: int = 0) -> Any:
    """Make a function lazy: calling it returns a ``PendingCompute`` to send to a pool.

    >>> import skyward as sky
    >>> @sky.compute
    ... def add(a: int, b: int) -> int:
    ...     return a + b
    >>> add.local(1, 2)
    3
    >>> with sky.ComputePool(nodes=2) as pool:  # doctest: +SKIP
    ...     add(1, 2) >> pool          # 3, on the least busy node
    ...     add(1, 2) @ pool           # [3, 3], one per node

    ``timeout`` (seconds) bounds each run on a pool (:class:`~skyward.TaskTimeout`); ``name``
    is what logs and errors call the task. ``retries`` (>= 0) runs a task whose node was lost
    (:class:`~skyward.WorkerLost`) again on another node, up to that many times; a task that
    raised in user code, timed out or was cancelled is never run again. Per call:
    ``f(x).with_options(retries=2)``.
    """
    if fn is None:
        return lambda f: ComputeFunction(f, name=name, timeout=timeout, retries=retries)
    return ComputeFunction(fn, name=name, timeout=timeout, retries=retries)


_blobs: weakref.WeakKeyDictionary[Callable[..., Any], bytes] = weakref.WeakKeyDictionary()
_bare_payloads: weakref.WeakKeyDictionary[Callable[..., Any], Payload] = weakref.WeakKeyDictionary()


def function_blob(fn: Callable[..., Any]) -> bytes:
    """The pickle of ``fn``, made once per function object.

    Note the consequence: globals a function captured by value are those of its first
    dispatch. Redefining the function (a new object) is always seen.
    """
    try:
        return _blobs[fn]
    except (KeyError, TypeError):
        pass
    blob = dumps_by_value(fn)
    try:
        _blobs[fn] = blob
    except TypeError:  # not weak-referenceable (a builtin): just don't cache
        pass
    return blob


def _rebuild_pending(state: bytes) -> PendingCompute[Any]:
    import pickle

    return PendingCompute(*pickle.loads(state))


# -- helpers ---------------------------------------------------------------------------------


_POOL_METHODS = ("run", "broadcast", "submit", "gather")
#: Types seen to have every method of :class:`Pool`. A plain check per type, cached, rather than
#: ``isinstance`` on a ``runtime_checkable`` protocol, which costs tens of microseconds a call
#: on the dispatch path.
_pool_types: set[type] = set()


def _pool(pool: Any, op: str) -> Pool:
    kind = type(pool)
    if kind not in _pool_types:
        if not all(callable(getattr(kind, m, None)) for m in _POOL_METHODS):
            raise ConfigError(f"right-hand side of {op}", "a ComputePool", _describe(pool))
        _pool_types.add(kind)
    return pool


def _reject_open_files(p: PendingCompute[Any]) -> None:
    """An open file is this process's handle, not data: cloudpickle would silently send a copy
    of what is left to read (as a StringIO), so say so instead, naming the argument."""
    if not p.args and not p.kwargs:
        return
    import io

    if not any(isinstance(v, io.IOBase) for v in (*p.args, *p.kwargs.values())):
        return
    import inspect

    try:
        named = list(inspect.signature(p.fn).bind_partial(*p.args, **p.kwargs).arguments.items())
    except (TypeError, ValueError):
        named = [(f"argument {i}", v) for i, v in enumerate(p.args)] + list(p.kwargs.items())
    for name, value in named:
        if isinstance(value, io.IOBase):
            raise SerializationError(
                f"argument {name!r} of {p.options.name}()", "a picklable value", _describe(value),
                detail="an open file is a handle of this process: pass its path (and send the file with "
                       "Image(include=...)) or its contents (f.read())",
            )


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}"


def _explain_unpicklable(p: PendingCompute[Any], exc: Exception) -> SerializationError:
    """Find which part of the call cannot be pickled and say so by name."""
    import inspect

    detail = f"{type(exc).__name__}: {exc}"
    try:
        sig = inspect.signature(p.fn)
        bound = sig.bind_partial(*p.args, **p.kwargs)
        named = list(bound.arguments.items())
    except (TypeError, ValueError):
        named = [(f"#{i}", a) for i, a in enumerate(p.args)] + list(p.kwargs.items())
    for arg_name, value in named:
        try:
            dumps_by_value(value)
        except Exception as arg_exc:
            return SerializationError(
                f"argument {arg_name!r} of {p.options.name}()",
                "a picklable value",
                type(value).__name__,
                detail=f"{type(arg_exc).__name__}: {arg_exc}",
            )
    return SerializationError(f"function {p.options.name}", "a picklable function", p.fn, detail=detail)
