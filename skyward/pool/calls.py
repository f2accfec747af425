"""What a pool serves once open: the calls behind the operators (``submit`` for ``>``, ``run``
for ``>>``, ``broadcast`` for ``@``, ``gather`` for ``&``), ``map``, ``device``, a clear error
for an operator written the wrong way round, and what it shows of itself (``is_open``,
``instances``, ``worker_pids``).

:class:`PoolCalls` is a part of :class:`~skyward.pool.pool.ComputePool` (its base class): the
pool provides the state, the nodes and the :class:`~skyward.pool.dispatch.Dispatcher` these
methods use.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

from skyward._features import NamedSession, SpawnedJob, features
from skyward.compute import ComputeFunction, PendingCompute, TaskOptions
from skyward.errors import ConfigError
from skyward.pool.connection import NodeConnection
from skyward.pool.dispatch import Dispatcher, check_pending
from skyward.pool.guards import not_pending, swapped
from skyward.providers.base import Instance

if TYPE_CHECKING:
    from skyward.pool.lifecycle import Nodes

__all__ = ["PoolCalls"]

T = TypeVar("T")
A = TypeVar("A")


class PoolCalls:
    """The open pool's side of :class:`~skyward.pool.pool.ComputePool`: its calls and what it shows."""

    if TYPE_CHECKING:  # provided by ComputePool
        name: str | None
        _cluster: NamedSession | None
        _state: Literal["new", "starting", "open", "closed"]
        _nodes: Nodes
        _dispatch: Dispatcher

        @property
        def nodes(self) -> int: ...

    # -- dispatch --------------------------------------------------------------------------------
    def _require_open(self) -> list[NodeConnection]:
        if self._state != "open":
            raise ConfigError(
                "pool", "an open ComputePool (dispatch inside `with sky.ComputePool(...) as pool:`)",
                f"a {self._state} pool" if self._state != "new" else "a pool that was never entered",
            )
        return self._nodes.connections

    def submit(self, pending: PendingCompute[T]) -> Future[T]:
        """Run ``pending`` on the least busy node without waiting (same as ``pending > pool``)."""
        check_pending(pending, "submit")
        return self._dispatch.submit(pending)

    def run(self, pending: PendingCompute[T]) -> T:
        """Run ``pending`` on the least busy node and return its result (``pending >> pool``)."""
        check_pending(pending, "run")
        return self._dispatch.run(pending)

    def broadcast(self, pending: PendingCompute[T]) -> list[T]:
        """Run ``pending`` on every worker process; results in global rank order (``pending @ pool``;
        with one process per node, one result per node). A shell command runs once per node.

        The call is serialized once. If a node fails, the others' tasks are cancelled and
        that node's error is raised.
        """
        check_pending(pending, "broadcast")
        return self._dispatch.broadcast(pending)

    def gather(self, *pending: PendingCompute[Any], stream: bool = False, ordered: bool = True) -> Any:
        """Run several pending calls concurrently across the pool.

        Returns a list in input order, or with ``stream=True`` an iterator yielding results
        as they become available (input order, or completion order with ``ordered=False``).
        """
        for i, p in enumerate(pending):
            check_pending(p, f"gather() argument {i}")
        return self._dispatch.gather(pending, stream, ordered)

    @overload
    def map(self, fn: ComputeFunction[[A], T], iterable: Iterable[A]) -> list[T]: ...
    @overload
    def map(self, fn: Callable[[A], T], iterable: Iterable[A]) -> list[T]: ...
    def map(self, fn: Any, iterable: Iterable[Any]) -> list[Any]:
        """Run ``fn(item)`` for every item across the pool; results in input order."""
        if isinstance(fn, ComputeFunction):
            pending = [fn(item) for item in iterable]
        elif callable(fn):
            options = TaskOptions(getattr(fn, "__name__", "task"))
            pending = [PendingCompute(fn, (item,), {}, options) for item in iterable]
        else:
            raise ConfigError("fn", "a @sky.compute function or a callable", fn)
        return self.gather(*pending)

    def device(self, kind: str = "cpu", node: int = 0) -> Any:
        """A remote torch device on node ``node``: ``torch.device("sky:N")``.

        ``kind`` is the node's device to use (``"cpu"``, ``"cuda"``, ``"cuda:1"``). Tensors moved
        to the returned device live on that node's worker; the operations on them are streamed
        there (see :mod:`skyward.torch`). The same (node, kind) gives the same device; the device
        closes with the pool. Raises :class:`~skyward.DeviceError` listing the node's devices
        when it has no ``kind``.
        """
        return features.device()(self, kind, node)

    # -- jobs that outlive the client (named clusters) ------------------------------------------
    @overload
    def spawn(self, pending: PendingCompute[T], *, broadcast: Literal[False] = False) -> SpawnedJob[T]: ...
    @overload
    def spawn(self, pending: PendingCompute[T], *, broadcast: Literal[True]) -> SpawnedJob[list[T]]: ...
    def spawn(self, pending: PendingCompute[Any], *, broadcast: bool = False) -> SpawnedJob[Any]:
        """Put ``pending`` in the cluster's job queue and return its :class:`~skyward.Job` at once.

        The call runs on the head node (with ``broadcast=True``: on every node, as ``@`` does,
        one result per node) in a process of its own, detached from this client: leaving the
        ``with`` block, or this process dying, does not stop it. Collect it later, from any
        process: ``pool.job(job.id).result()``. It is a job like ``skyward exec``'s: same ids,
        ``skyward queue``, ``skyward cancel``. Named clusters only (``ComputePool(name=...)``):
        an unnamed pool raises :class:`~skyward.ConfigError`.
        """
        check_pending(pending, "spawn")
        if not isinstance(broadcast, bool):
            raise ConfigError("broadcast", "True (every node) or False (the head node)", broadcast)
        cluster = self._named("spawn")
        self._require_open()
        return cluster.spawn(self, pending, broadcast)

    def job(self, job: int | SpawnedJob[Any]) -> SpawnedJob[Any]:
        """Job ``job`` (its id) of this named cluster, spawned or a command, by any process:
        ``pool.job(3).result()``. Raises :class:`~skyward.JobError` naming the jobs there are
        when the cluster has no such job, or when ``job`` is a Job of another cluster."""
        return self._named("job").job(job)

    def jobs(self) -> list[SpawnedJob[Any]]:
        """This named cluster's jobs, oldest first (spawned calls and commands)."""
        return self._named("jobs").jobs()

    def _named(self, method: str) -> NamedSession:
        if self._cluster is None:
            raise ConfigError("pool", f"a pool on a named cluster for pool.{method}() (sky.ComputePool(name=...)): "
                              "a job lives in the cluster's queue, which outlives this client",
                              "an unnamed pool", detail="an unnamed pool's work ends with its `with` block")
        return self._cluster

    def _connection(self, node: int) -> NodeConnection:
        """Node ``node``'s first worker process."""
        for c in self._require_open():
            if c.node == node and c.local_rank == 0:
                return c
        raise ConfigError("node", f"a node of this pool (0..{self.nodes - 1})", node)

    # -- operators the wrong way round -------------------------------------------------------
    # ``pending >> pool`` is PendingCompute's own operator; these catch ``pool >> pending``
    # (operands swapped) and ``f >> pool`` (no pending call on the left), which Python would
    # otherwise report as a bare "unsupported operand type(s)" TypeError.
    def __rshift__(self, other: Any) -> Any:
        raise swapped(">>", other)

    def __matmul__(self, other: Any) -> Any:
        raise swapped("@", other)

    def __gt__(self, other: Any) -> Any:
        raise swapped(">", other)

    def __rrshift__(self, other: Any) -> Any:
        raise not_pending(">>", other)

    def __rmatmul__(self, other: Any) -> Any:
        raise not_pending("@", other)

    def __lt__(self, other: Any) -> Any:  # ``x > pool`` when x has no ``>`` of its own
        raise not_pending(">", other)

    # -- introspection ---------------------------------------------------------------------------
    @property
    def is_open(self) -> bool:
        """True between a successful start (``with`` entered) and the start of teardown."""
        return self._state == "open"

    @property
    def instances(self) -> list[Instance]:
        """The pool's machines (id, node, addresses), once it is started."""
        return list(self._nodes.instances)

    def worker_pids(self) -> list[int | None]:
        """The process id of each worker (by global rank) on its machine (None if unknown)."""
        return [c.pid for c in self._nodes.connections]
