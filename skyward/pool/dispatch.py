"""Dispatch: which node runs a call, and collecting the answers (``>>``, ``@``, ``&``, ``>``).

A call is serialized once (also for a broadcast) and sent to the least busy live node
(round-robin among equals); a broadcast goes to every node. Waiting for several futures stops
at the first failure and cancels the rest; a failed broadcast also stops the other nodes'
copies, since they may be blocked in a collective operation waiting for the failed one.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, Future, wait
from typing import Any, TypeVar

from skyward.compute import PendingCompute
from skyward.compute import _iter_results as iter_results
from skyward.errors import ConfigError
from skyward.pool.connection import NodeConnection

T = TypeVar("T")
#: Seconds the other nodes of a failed broadcast get to stop before their workers are replaced.
BROADCAST_GRACE = 2.0


class Dispatcher:
    """Sends calls to the connections ``connections()`` returns (the open pool's, or raises)."""

    def __init__(self, connections: Callable[[], list[NodeConnection]],
                 restart: Callable[[], None], close: Callable[[], None]):
        self._connections = connections
        self._restart = restart  # replace every worker (after a broadcast left nodes stuck)
        self._close = close  # give up on the pool (when even that fails)
        self._rr = 0
        self._pick_lock = threading.Lock()

    def least_busy(self) -> NodeConnection:
        conns = self._connections()
        if len(conns) == 1 and conns[0].alive:
            return conns[0]
        with self._pick_lock:
            n = len(conns)
            start = self._rr
            self._rr = (self._rr + 1) % n
            best: NodeConnection | None = None
            for k in range(n):
                c = conns[(start + k) % n]
                if c.alive and (best is None or c.inflight < best.inflight):
                    best = c
        if best is None:
            raise next((c for c in conns if c.lost), conns[0]).loss()
        return best

    def submit(self, pending: PendingCompute[T]) -> Future[T]:
        conn = self.least_busy()
        return conn.submit(pending.payload(), pending.options.name, pending.options.timeout)

    def run(self, pending: PendingCompute[T]) -> T:
        conn = self.least_busy()
        return conn.call(pending.payload(), pending.options.name, pending.options.timeout)

    def broadcast(self, pending: PendingCompute[T]) -> list[T]:
        conns = self._connections()
        if pending.options.per_node:  # once per node: each node's first worker process
            conns = [c for c in conns if c.local_rank == 0]
        for c in conns:
            if not c.alive:
                raise c.loss()
        payload = pending.payload()
        futures = [c.submit(payload, pending.options.name, pending.options.timeout) for c in conns]
        return collect(futures, conns, on_failure=self._recover_from_failed_broadcast)

    def gather(self, pending: tuple[PendingCompute[Any], ...], stream: bool, ordered: bool) -> Any:
        self._connections()
        owners: list[NodeConnection] = []
        futures: list[Future[Any]] = []
        for p in pending:
            conn = self.least_busy()
            futures.append(conn.submit(p.payload(), p.options.name, p.options.timeout))
            owners.append(conn)
        if stream:
            return _stream(futures, owners, ordered)
        return collect(futures, owners)

    def _recover_from_failed_broadcast(self, futures: list[Future[Any]], conns: list[NodeConnection],
                                       error: BaseException) -> None:
        """One node failed: stop the others' copies of the task, restarting workers if need be.

        A node that has not stopped within ``BROADCAST_GRACE`` seconds, or a node that was lost,
        leaves the pool's distributed state unusable, so every worker is replaced (plugins'
        ``around_app`` hooks run again) and the pool stays usable.
        """
        for f, conn in zip(futures, conns, strict=True):
            if not f.done():
                conn.interrupt(f)
        wait(futures, timeout=BROADCAST_GRACE)
        stuck = [c.node for f, c in zip(futures, conns, strict=True) if not f.done()]
        lost = [c.node for c in conns if not c.alive]
        silent = sorted({c.node for c in conns if not c.alive and c.went_silent})
        if not stuck and not lost:
            return
        if silent and not stuck:
            # Its host may be cut off: a restart would wait on it, then fail. As with a future,
            # the error is raised now and the pool goes on with the other nodes.
            _note(error, f"skyward: node(s) {lost} were lost, {silent} by going silent (a host that may be "
                         f"unreachable): the workers were not restarted; the pool goes on without the lost ones")
            return
        why = []
        if stuck:
            why.append(f"node(s) {stuck} did not stop within {BROADCAST_GRACE:g}s")
        if lost:
            why.append(f"node(s) {lost} were lost")
        try:
            with self._pick_lock:
                self._restart()
        except Exception as exc:
            _note(error, f"skyward: {' and '.join(why)}; restarting the workers failed ({exc!r}), closing the pool")
            self._close()
            return
        _note(error, f"skyward: {' and '.join(why)}; every worker was restarted and the pool is usable")


def collect(futures: list[Future[Any]], owners: list[NodeConnection],
            on_failure: Callable[[list[Future[Any]], list[NodeConnection], BaseException], None] | None = None,
            ) -> list[Any]:
    """Wait for every future; at the first failure stop the rest and raise that failure."""
    try:
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
    except BaseException:  # Ctrl-C while waiting: stop what we started
        cancel(futures, owners)
        raise
    error = next((f.exception() for f in futures if f in done and f.exception() is not None), None)
    if error is not None:
        if on_failure is None:
            cancel(futures, owners)
        else:
            on_failure(futures, owners, error)
        raise error
    return [f.result() for f in futures]


def _stream(futures: list[Future[Any]], owners: list[NodeConnection], ordered: bool) -> Iterator[Any]:
    try:
        yield from iter_results(futures, ordered)
    finally:
        cancel(futures, owners)


def cancel(futures: list[Future[Any]], owners: list[NodeConnection]) -> None:
    for f, conn in zip(futures, owners, strict=True):
        if not f.done():
            conn.cancel(f)
            f.cancel()


def _note(error: BaseException, text: str) -> None:
    with contextlib.suppress(Exception):
        error.add_note(text)


def check_pending(value: Any, where: str) -> None:
    if not isinstance(value, PendingCompute):
        raise ConfigError(where, "a pending computation (a call of a @sky.compute function)", type(value).__name__)
