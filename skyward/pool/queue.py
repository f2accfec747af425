"""The client-side queue of an elastic pool: a task goes to a worker only when it has a free slot.

A fixed pool sends every task at once (the worker queues what its slots cannot run yet). An
elastic pool cannot: a task sent to a busy node stays there even when a node added a second
later is idle. So its ``>>``, ``>``, ``&``/``gather`` and ``map`` wait here, in the client,
and each is sent when a worker has fewer tasks of this queue in flight than it has slots
(the least loaded such worker). The scaler (:mod:`skyward.pool.elastic`) reads the queue's
age to add nodes, and each node's idle time to release it.

Guarantees:

1. Tasks leave in the order they came (a retried task goes first).
2. Cancelling a queued future removes it; cancelling a sent one cancels it on its worker.
3. A node claimed for release (:meth:`TaskQueue.claim_idle`) gets nothing more from the queue;
   the claim and the sending are decided under one lock, so a task never lands on a node
   that is going away.
4. Nothing here blocks on I/O while holding the lock: a task is sent after its slot is taken.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any

from skyward.pool.connection import NodeConnection
from skyward.protocol import Payload


@dataclass(eq=False)
class _Item:
    payload: Payload
    name: str
    timeout: float | None
    future: Future[Any]
    since: float = field(default_factory=time.monotonic)
    inner: Future[Any] | None = None


class TaskQueue:
    """Tasks waiting for a free slot of the workers ``connections()`` returns (``slots`` each)."""

    def __init__(self, connections: Callable[[], list[NodeConnection]], slots: int):
        self._connections = connections
        self._slots = slots
        self._lock = threading.Lock()
        self._items: collections.deque[_Item] = collections.deque()
        self._load: dict[NodeConnection, int] = {}  # tasks of this queue in flight, per worker
        self._busy_until: dict[int, float] = {}  # node -> when it last had a task of this queue
        self._draining: set[int] = set()

    # -- what the scaler reads ---------------------------------------------------------------
    def waiting(self) -> tuple[int, float]:
        """(tasks waiting, seconds the oldest has waited)."""
        with self._lock:
            if not self._items:
                return 0, 0.0
            return len(self._items), time.monotonic() - self._items[0].since

    def claim_idle(self, idle_for: float, keep: int) -> list[int]:
        """The highest-numbered nodes, each with no task for ``idle_for`` seconds, at most as
        many as leave ``keep`` nodes; each is claimed (gets nothing more from here). A node
        that is not idle keeps the nodes below it: the numbers left stay dense (DDP ranks) and
        the head (node 0, torch's MASTER_ADDR) stays."""
        now = time.monotonic()
        with self._lock:
            if self._items:
                return []
            conns = [c for c in self._connections() if c.node not in self._draining]
            nodes = sorted({c.node for c in conns}, reverse=True)
            busy = {c.node for c in conns if self._load.get(c, 0) or c.inflight}
            idle = [n not in busy and now - self._busy_until.setdefault(n, now) >= idle_for for n in nodes]
            claimed: list[int] = []
            for n, is_idle in zip(nodes[:max(0, len(nodes) - keep)], idle, strict=False):
                if not is_idle:
                    break
                claimed.append(n)
            self._draining.update(claimed)
            return claimed

    def forget(self, node: int) -> None:
        """Node ``node`` left the pool (a new node may take its number)."""
        with self._lock:
            self._draining.discard(node)
            self._busy_until.pop(node, None)
            for conn in [c for c in self._load if c.node == node]:
                del self._load[conn]

    # -- tasks -------------------------------------------------------------------------------
    def submit(self, payload: Payload, name: str, timeout: float | None, *, first: bool = False) -> Future[Any]:
        """Queue a task; its result resolves the returned Future (``first``: ahead of the others)."""
        item = _Item(payload, name, timeout, Future())
        item.future.add_done_callback(lambda f: self._cancelled(item) if f.cancelled() else None)
        with self._lock:
            if first:
                self._items.appendleft(item)
            else:
                self._items.append(item)
        self.pump()
        return item.future

    def pump(self) -> None:
        """Send waiting tasks to workers with a free slot (call when slots or workers change)."""
        while True:
            with self._lock:
                if not self._items:
                    return
                free = [c for c in self._connections()
                        if c.alive and c.node not in self._draining and self._load.get(c, 0) < self._slots]
                if not free:
                    return
                conn = min(free, key=lambda c: self._load.get(c, 0))
                item = self._items.popleft()
                self._load[conn] = self._load.get(conn, 0) + 1
                self._busy_until[conn.node] = time.monotonic()
            inner = conn.submit(item.payload, item.name, item.timeout)
            item.inner = inner
            if item.future.cancelled():  # (cancelled between leaving the queue and being sent)
                inner.cancel()
            inner.add_done_callback(functools.partial(self._finished, conn, item))

    def _finished(self, conn: NodeConnection, item: _Item, inner: Future[Any]) -> None:
        with self._lock:
            if conn in self._load:
                self._load[conn] -= 1
            self._busy_until[conn.node] = time.monotonic()
        if not item.future.done():
            with contextlib.suppress(InvalidStateError):
                if inner.cancelled():
                    item.future.cancel()
                elif inner.exception() is not None:
                    item.future.set_exception(inner.exception())  # type: ignore[arg-type]
                else:
                    item.future.set_result(inner.result())
        self.pump()

    def _cancelled(self, item: _Item) -> None:
        with self._lock:
            with contextlib.suppress(ValueError):
                self._items.remove(item)
        if item.inner is not None and not item.inner.done():
            item.inner.cancel()

    def fail_all(self, error: BaseException) -> None:
        """Fail every waiting task with ``error`` (the pool is closing)."""
        with self._lock:
            items, self._items = list(self._items), collections.deque()
        for item in items:
            with contextlib.suppress(InvalidStateError):
                if not item.future.done():
                    item.future.set_exception(error)
