"""Dispatch: which node runs a call, and collecting the answers (``>>``, ``@``, ``&``, ``>``).

A call is serialized once (also for a broadcast) and sent to the least busy live node
(round-robin among equals); a broadcast goes to every node. Waiting for several futures stops
at the first failure and cancels the rest; a failed broadcast also stops the other nodes'
copies, since they may be blocked in a collective operation waiting for the failed one.

An elastic pool (``nodes=(min, max)``) sends its calls through its client-side queue
(:mod:`skyward.pool.queue`) instead; broadcasts go straight to the nodes it has at that
moment, except that a pool below its ``min`` while a lost node is replaced waits for the
replacement first. A call with ``retries`` is wrapped by :func:`skyward.pool.retry.retrying`; a call
without takes exactly the fixed pool's path.
"""

from __future__ import annotations

import contextlib
import heapq
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, Future, wait
from typing import TYPE_CHECKING, Any, TypeVar

from skyward import events as ev
from skyward._retry import Backoff, retry
from skyward.compute import PendingCompute
from skyward.errors import ConfigError
from skyward.pool.batch import submit_batch
from skyward.pool.connection import NodeConnection
from skyward.pool.retry import retrying
from skyward.protocol import Payload

if TYPE_CHECKING:
    from skyward.pool.elastic import Elastic
    from skyward.pool.queue import TaskQueue

T = TypeVar("T")
#: Seconds the other nodes of a failed broadcast get to stop before their workers are replaced.
BROADCAST_GRACE = 2.0


class Dispatcher:
    """Sends calls to the connections ``connections()`` returns (the open pool's, or raises)."""

    def __init__(self, connections: Callable[[], list[NodeConnection]],
                 restart: Callable[[], None], close: Callable[[], None], *, queue: TaskQueue | None = None,
                 elastic: Elastic | None = None, emit: Callable[[ev.Event], None] = lambda e: None,
                 is_open: Callable[[], bool] = lambda: True):
        self._connections = connections
        self._restart = restart  # replace every worker (after a broadcast left nodes stuck)
        self._close = close  # give up on the pool (when even that fails)
        self._rr = 0
        self._pick_lock = threading.Lock()
        #: An elastic pool's queue (None: tasks go straight to the least busy worker).
        self.queue = queue
        self._elastic = elastic  # lost nodes replaced / scaling (None: the pool never changes)
        self._emit = emit
        self._is_open = is_open
        self._generation: Callable[[], int] = lambda: elastic.nodes.generation if elastic is not None else 0

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

    def picker(self) -> Callable[[], NodeConnection]:
        """:meth:`least_busy` for many tasks sent one after another (a gather), in O(log N) a
        pick instead of O(N): see :class:`_Picks`."""
        conns = self._connections()
        if len(conns) == 1:
            return self.least_busy
        with self._pick_lock:
            start = self._rr
        return _Picks(conns, start, self._picked).next

    def _picked(self, index: int) -> None:
        self._rr = index + 1  # (no lock: a pointer for ties, which a race only shifts by one)

    def submit(self, pending: PendingCompute[T]) -> Future[T]:
        if self.queue is None and not pending.options.retries:  # the fast path
            conn = self.least_busy()
            return conn.submit(pending.payload(), pending.options.name, pending.options.timeout)
        return self._submit(pending)

    def run(self, pending: PendingCompute[T]) -> T:
        if self.queue is None and not pending.options.retries:  # the fast path
            conn = self.least_busy()
            return conn.call(pending.payload(), pending.options.name, pending.options.timeout)
        return self._submit(pending).result()

    def _submit(self, pending: PendingCompute[Any], sent: Future[Any] | None = None,
                payload: Payload | None = None) -> Future[Any]:
        """Send through the queue and/or with retries (the calls the fast path does not take);
        ``sent``: a task with retries whose first attempt is under way (a gather's batch)."""
        self._connections()  # (raises when the pool is not open)
        if self._elastic is not None:
            self._elastic.raise_error()
        payload, options = pending.payload() if payload is None else payload, pending.options
        if self.queue is not None:
            queue = self.queue
            if not options.retries:
                return queue.submit(payload, options.name, options.timeout)
            sent = 0

            def queued() -> Future[Any]:
                nonlocal sent
                sent += 1  # (a retry goes ahead of the waiting tasks)
                return queue.submit(payload, options.name, options.timeout, first=sent > 1)

            return retrying(queued, options.retries, options.name, self._emit, self._is_open)

        first = [sent] if sent is not None else []

        def direct() -> Future[Any]:
            if first:
                return first.pop()
            if self._elastic is not None and not any(c.alive for c in self._connections()):
                self._elastic.wait_ready()  # every node lost: wait for a replacement
            return self.least_busy().submit(payload, options.name, options.timeout)

        return retrying(direct, options.retries, options.name, self._emit, self._is_open)

    def broadcast(self, pending: PendingCompute[T]) -> list[T]:
        if not pending.options.retries:
            return self._broadcast(pending, self._recover_from_failed_broadcast)
        return self._broadcast_with_retries(pending)

    def _broadcast(self, pending: PendingCompute[T], on_failure: Callable[..., None]) -> list[T]:
        if self._elastic is not None:  # a pool below its size while replacing a node: wait
            self._elastic.wait_full()
        conns = self._targets(pending)
        for c in conns:
            if not c.alive:
                raise c.loss()
        payload = pending.payload()
        futures = [c.submit(payload, pending.options.name, pending.options.timeout) for c in conns]
        return collect(futures, conns, on_failure=on_failure)

    def _targets(self, pending: PendingCompute[Any]) -> list[NodeConnection]:
        conns = self._connections()
        if pending.options.per_node:  # once per node: each node's first worker process
            conns = [c for c in conns if c.local_rank == 0]
        return conns

    def _broadcast_with_retries(self, pending: PendingCompute[T]) -> list[T]:
        """A broadcast whose node is lost runs again as a whole: the other copies stopped, the
        lost node's replacement awaited (``replace_lost``; without it the loss is raised),
        every worker restarted (plugins' ``around_app`` runs again with the new peers: torch's
        process group re-forms, node 0's address as MASTER_ADDR), up to ``retries`` times.

        A failure counts as a loss when a node of the broadcast was lost, whichever error came
        first: the other nodes' copies often fail too (a collective whose peer is gone)."""
        options = pending.options
        attempts = options.retries + 1
        tried: dict[str, Any] = {}  # the attempt's nodes, the workers' generation, the node lost

        def once() -> list[T]:
            tried.clear()
            tried["conns"] = self._targets(pending)
            tried["generation"] = self._generation()
            return self._broadcast(pending, _stop_the_others)

        def giveup(exc: BaseException) -> bool:
            """Only a loss is tried again, on an open pool that replaces lost nodes."""
            dead = [c for c in tried.get("conns", ()) if not c.alive]  # (the one lost first, not
            lost = next((c for c in dead if c.lost_serving), dead[0] if dead else None)  # one restarted since)
            elastic = self._elastic
            if lost is None or not self._is_open() or elastic is None or not elastic.replace_lost:
                return True
            tried["lost"] = lost
            return False

        def again(attempt: int, exc: BaseException, pause: float) -> None:
            assert self._elastic is not None
            self._elastic.wait_ready()
            if self._generation() == tried["generation"]:  # (a replacement may have restarted them all)
                with self._pick_lock:
                    self._restart()
            self._emit(ev.TaskRetried(options.name, tried["lost"].node, attempt + 1, attempts))

        return retry(once, Backoff(attempts=attempts, delay=0.0), giveup=giveup, on_retry=again)

    def gather(self, pending: tuple[PendingCompute[Any], ...], stream: bool, ordered: bool) -> Any:
        """Each task goes to the node a lone call would pick; each node then gets its tasks in
        few frames (:mod:`skyward.pool.batch`); a task with retries is sent again alone when
        its node is lost. An elastic pool's tasks go through its queue, one by one."""
        self._connections()
        owners: list[NodeConnection | None] = [None] * len(pending)
        futures: list[Future[Any]] = [None] * len(pending)  # type: ignore[list-item]
        batches: dict[NodeConnection, list[int]] = {}
        pick = self.picker() if self.queue is None else self.least_busy
        for i, p in enumerate(pending):
            if self.queue is None:
                conn = pick()
                batches.setdefault(conn, []).append(i)
                owners[i] = None if p.options.retries else conn  # (a retried one cancels itself)
            else:
                futures[i] = self._submit(p)
        payloads = {conn: [pending[i].payload() for i in indices] for conn, indices in batches.items()}
        try:  # (every task serialized first: one that cannot be is raised before any is sent)
            for conn, indices in batches.items():
                tasks = [(pl, pending[i].options.name, pending[i].options.timeout)
                         for pl, i in zip(payloads[conn], indices, strict=True)]
                for i, pl, future in zip(indices, payloads[conn], submit_batch(conn, tasks), strict=True):
                    futures[i] = self._submit(pending[i], future, pl) if pending[i].options.retries else future
        except BaseException:  # (Ctrl-C): stop what was sent
            sent = [k for k, f in enumerate(futures) if f is not None]
            cancel([futures[k] for k in sent], [owners[k] for k in sent])
            raise
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
        elastic = self._elastic
        if lost and elastic is not None and elastic.replace_lost:
            # The pool replaces the lost node itself (restarting now would race with that):
            # wait for it, then restart only if other nodes are stuck.
            try:
                elastic.wait_ready()
            except Exception as exc:
                _note(error, f"skyward: node(s) {lost} were lost and could not be replaced ({exc})")
                return
            if not stuck:
                _note(error, f"skyward: node(s) {lost} were lost and replaced; the pool is usable")
                return
            lost = []
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


class _Picks:
    """The least busy live node for each of many tasks, round-robin among equals (as
    :meth:`Dispatcher.least_busy`), from a heap of the nodes by tasks in flight: a pick is
    O(log N) and counts as one more task on its node. The heap is read from the nodes once,
    at the first pick: a gather picks every task's node before it sends any (in batches), so
    its picks are the load that the nodes' own counts do not show yet. A 1,000-node gather of
    100,000 tasks scanned every node for every task."""

    def __init__(self, conns: list[NodeConnection], start: int, picked: Callable[[int], None]):
        self._conns = conns
        self._picked = picked  # told the last node picked, so that the next call goes on from it
        self._start = start
        self._heap: list[tuple[int, int, int]] | None = None  # (in flight, place after the first, index)

    def next(self) -> NodeConnection:
        conns, heap = self._conns, self._heap
        if heap is None:
            n, first = len(conns), self._start
            heap = self._heap = [(c.inflight, (k - first) % n, k) for k, c in enumerate(conns) if c.alive]
            heapq.heapify(heap)
        while heap:
            load, place, k = heap[0]
            if conns[k].alive:
                heapq.heapreplace(heap, (load + 1, place, k))
                self._picked(k)
                return conns[k]
            heapq.heappop(heap)  # lost meanwhile: never picked again
        raise next((c for c in conns if c.lost), conns[0]).loss()


def _stop_the_others(futures: list[Future[Any]], conns: list[NodeConnection], error: BaseException) -> None:
    """A broadcast that may run again: its other copies are asked to stop and given
    ``BROADCAST_GRACE`` seconds (a loss among them shows by then); their workers are restarted
    before it runs again."""
    for f, conn in zip(futures, conns, strict=True):
        if not f.done():
            conn.interrupt(f)
    wait(futures, timeout=BROADCAST_GRACE)
    cancel(futures, conns)


def collect(futures: list[Future[Any]], owners: list[NodeConnection] | list[NodeConnection | None],
            on_failure: Callable[[list[Future[Any]], Any, BaseException], None] | None = None,
            ) -> list[Any]:
    """Wait for every future; at the first failure stop the rest and raise that failure."""
    try:
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
    except BaseException:  # Ctrl-C while waiting: stop what we started
        cancel(futures, owners)
        raise
    error = next((e for f in futures if f in done and (e := f.exception()) is not None), None)
    if error is not None:
        if on_failure is None:
            cancel(futures, owners)
        else:
            on_failure(futures, owners, error)
        raise error
    return [f.result() for f in futures]


def iter_results(futures: list[Future[Any]], ordered: bool) -> Iterator[Any]:
    """The futures' results, in their order or (``ordered=False``) as they complete."""
    from concurrent.futures import as_completed

    if ordered:
        for f in futures:
            yield f.result()
    else:
        for f in as_completed(futures):
            yield f.result()


def _stream(futures: list[Future[Any]], owners: list[NodeConnection | None], ordered: bool) -> Iterator[Any]:
    try:
        yield from iter_results(futures, ordered)
    finally:
        cancel(futures, owners)


def cancel(futures: list[Future[Any]], owners: list[NodeConnection] | list[NodeConnection | None]) -> None:
    """Stop the futures not done yet (a future with no known worker: a queued or retried one,
    which cancels itself on its worker)."""
    for f, conn in zip(futures, owners, strict=True):
        if not f.done():
            if conn is not None:
                conn.cancel(f)
            f.cancel()


def _note(error: BaseException, text: str) -> None:
    with contextlib.suppress(Exception):
        error.add_note(text)


def check_pending(value: Any, where: str) -> None:
    if not isinstance(value, PendingCompute):
        raise ConfigError(where, "a pending computation (a call of a @sky.compute function)", type(value).__name__)
