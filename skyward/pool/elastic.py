"""A pool that changes size while it runs: autoscaling on queued work, lost nodes replaced.

:class:`Elastic` owns every change to an open pool's membership. Its scaler thread (elastic
pools only) reads the :class:`~skyward.pool.queue.TaskQueue`:

- when the oldest task has waited ``scale_up_after`` seconds it adds
  ``min(max - current - adding, ceil(waiting / slots per node) - adding)`` nodes in one
  provider call (``adding``: nodes already on their way, which will take their share);
- a node with no task for ``scale_down_after`` seconds is released while the pool is above
  ``min`` (the queue claims it first, so no task lands on it), the highest numbers first:
  node 0, the head, stays.

With ``replace_lost``, a node whose worker is lost (exit, SIGKILL, silence) is released (its
host, if unreachable, not waited on longer than the silent-node limits) and a new node with
the same number provisioned in its place, up to :data:`REPLACE_ATTEMPTS` tries; a failure
is a ``NodeRemoved(node, "replacement failed: ...")`` event and the error of the pool's next
call (and of :meth:`Elastic.wait_ready`), never a hang. A broadcast on a pool below ``min``
while a node is replaced waits for it (:meth:`Elastic.wait_full`).

Guarantees: no lock is held while a provider or a host is waited on; every thread started
here is joined by :meth:`Elastic.stop` (the pool's teardown, on every exit path), and an
addition under way when the pool closes releases what it acquired before that returns.
"""

from __future__ import annotations

import functools
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from skyward import events as ev
from skyward._retry import Backoff, retry
from skyward.errors import BootstrapError, ConfigError, SkywardError, WorkerLost
from skyward.pool.lifecycle import Nodes
from skyward.pool.queue import TaskQueue

#: Tries to provision a replacement for one lost node before giving up.
REPLACE_ATTEMPTS = 3
#: Seconds before the second try (doubled before each further one).
REPLACE_PAUSE = 1.0


def check_provider(options: Any) -> None:
    """ConfigError (before anything starts) for an elastic or ``replace_lost`` pool whose
    provider cannot add machines to a running pool."""
    elastic = options.elastic
    if (elastic or options.replacing) and not options.provider.can_acquire:
        raise ConfigError("nodes" if elastic else "replace_lost",
                          f"{'a number of nodes' if elastic else 'False'} with {options.provider!r} (it cannot "
                          "add machines to a running pool)", options.nodes if elastic else True)


def elastic_parts(options: Any, nodes: Nodes, emit: Callable[[ev.Event], None]
                  ) -> tuple[Elastic | None, TaskQueue | None]:
    """What a pool with ``options`` (:class:`~skyward.pool.options.PoolOptions`) needs: its queue
    (elastic pools) and its :class:`Elastic` (elastic or ``replace_lost``); (None, None) for
    a plain pool, which then takes exactly the fixed pool's paths."""
    queue = TaskQueue(lambda: nodes.connections, options.concurrency) if options.elastic else None
    if not (options.elastic or options.replacing):
        return None, None
    elastic = Elastic(nodes, queue, options.limits, scale_up_after=options.scale_up_after,
                      scale_down_after=options.scale_down_after, replace_lost=options.replacing, emit=emit)
    elastic.queue_slots = options.concurrency * options.processes
    elastic.start_timeout = options.start_timeout
    return elastic, queue


class Elastic:
    """Membership changes of one open pool (see the module docstring)."""

    def __init__(self, nodes: Nodes, queue: TaskQueue | None, limits: tuple[int, int], *, scale_up_after: float,
                 scale_down_after: float, replace_lost: bool, emit: Callable[[ev.Event], None]):
        self.nodes = nodes
        self.queue = queue
        self.min, self.max = limits
        self.scale_up_after = scale_up_after
        self.scale_down_after = scale_down_after
        self.replace_lost = replace_lost
        self._emit = emit
        self._changed = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._adding = 0  # nodes being added (scale-up or replacement)
        self._replacing: set[int] = set()
        self._closed = threading.Event()
        self.error: BaseException | None = None  # a replacement that failed, for the next call
        # Told of losses from the first worker on (its connection is made with the watching
        # emit), acting on them once the pool is open (a loss while it starts fails the start).
        self._started = False
        nodes.on_lost = self._lost

    def start(self) -> None:
        """Begin watching: lost nodes from now on; queue and idle nodes for an elastic pool."""
        self._started = True
        if self.queue is not None:
            self._spawn(self._scale_loop, "skyward-scaler")

    @property
    def size(self) -> int:
        """Nodes now, plus those being added."""
        return len(self.nodes.instances) + self._adding

    # -- waiting -----------------------------------------------------------------------------
    def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until no replacement is under way (and, with replace_lost, every worker is
        alive); raise the error of a replacement that failed (once), TimeoutError after
        ``timeout`` seconds."""
        self._wait_until(lambda: not self._replacing and not self._dead(), timeout,
                         lambda: TimeoutError(f"the pool's replacement nodes were not ready within {timeout:g}s"))

    def wait_full(self) -> None:
        """Before a broadcast: while the pool is below its ``min`` because a lost node is being
        replaced, wait for the replacement (``start_timeout`` seconds at most, then
        BootstrapError), so that a broadcast never runs on fewer nodes by accident (a smaller
        DDP world); raise the error of a replacement that failed (once). An autoscaling pool
        at or above ``min`` broadcasts to the nodes it has."""
        def short() -> list[int]:  # the nodes being replaced, while the pool is below min
            if not self.replace_lost:
                return []
            conns = self.nodes.connections
            live = {c.node for c in conns} - {c.node for c in conns if not c.alive}
            waited = sorted(self._replacing | {c.node for c in conns if not c.alive})
            return waited if len(live) < self.min else []

        def late() -> BaseException:
            missing = short()
            return BootstrapError("replacement", "replacing a lost node",
                                  f"not ready within start_timeout={self.start_timeout:g}s; a broadcast waits "
                                  f"for it so that it runs on all {self.min} nodes", node=missing[0] if missing else None)

        self._wait_until(lambda: not short(), self.start_timeout, late)

    def _dead(self) -> bool:
        return self.replace_lost and any(not c.alive for c in self.nodes.connections)

    def _wait_until(self, done: Callable[[], bool], timeout: float | None,
                    timed_out: Callable[[], BaseException]) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while not (self.error is not None or self._closed.is_set() or done()):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise timed_out()
                self._changed.wait(0.1 if left is None else min(0.1, left))
        self.raise_error()

    def raise_error(self) -> None:
        """Raise (once) the error of a replacement that failed since the last call."""
        error, self.error = self.error, None
        if error is not None:
            raise error

    # -- scaling -----------------------------------------------------------------------------
    def _scale_loop(self) -> None:
        assert self.queue is not None
        tick = min(0.25, self.scale_up_after / 4, self.scale_down_after / 4)
        while not self._closed.wait(tick):
            waiting, age = self.queue.waiting()
            if waiting and age >= self.scale_up_after:
                slots = max(1, self.queue_slots)
                # (nodes already being added will take their share of the queue)
                count = min(self.max - self.size, math.ceil(waiting / slots) - self._adding)
                if count > 0:
                    numbers = self.nodes.reserve(count)
                    self._begin_add(len(numbers))
                    self._spawn(functools.partial(self._add, numbers, f"scale-up: {waiting} tasks waiting"),
                                "skyward-scale-up")
            elif not waiting:
                for node in self.queue.claim_idle(self.scale_down_after, self.min):
                    self._remove(node, f"idle {self.scale_down_after:g}s", lost=False)

    queue_slots = 1  # task slots per node (set by the pool)
    start_timeout = 120.0  # the pool's: how long a broadcast waits for a replacement

    def _add(self, numbers: list[int], reason: str) -> None:
        try:
            self.nodes.grow(numbers)
        except BaseException as exc:
            if not self._closed.is_set():
                self._emit(ev.NodeLog(numbers[0], f"adding node(s) {numbers} failed: {exc}"))
            return
        finally:
            self._end_add(len(numbers))
        for node in numbers:
            self._emit(ev.NodeAdded(node, reason))
        if self.queue is not None:
            self.queue.pump()

    def _remove(self, node: int, reason: str, *, lost: bool) -> None:
        problems = self.nodes.release(node, lost=lost)
        if self.queue is not None:
            self.queue.forget(node)
        self._emit(ev.NodeRemoved(node, reason + (f" ({'; '.join(problems)})" if problems else "")))

    # -- lost nodes --------------------------------------------------------------------------
    def _lost(self, node: int, why: str) -> None:
        """A member's worker was lost (called on the thread that noticed: must not block)."""
        ended = next((c.lost for c in self.nodes.connections if c.node == node and c.lost is not None
                      and not isinstance(c.lost, WorkerLost)), None)
        with self._changed:
            if node in self._replacing or self._closed.is_set() or not self._started:
                return
            if ended is not None:  # the provider named the pool's end (a time limit): not replaced
                self.error = ended
                self._changed.notify_all()
                return
            if self.replace_lost:
                self._replacing.add(node)
                self._adding += 1
        self._spawn(lambda: self._replace(node, why), f"skyward-replace-{node}")

    def _replace(self, node: int, why: str) -> None:
        if not self.replace_lost:  # an elastic pool without replace_lost: it only shrinks
            self._remove(node, f"lost: {why}", lost=True)
            return
        try:
            self._remove(node, f"lost: {why}; replacing", lost=True)
            try:
                retry(lambda: self._grow_in_place(node),
                      Backoff(attempts=REPLACE_ATTEMPTS, delay=REPLACE_PAUSE, factor=2.0, sleep=self._closed.wait),
                      giveup=lambda exc: self._closed.is_set())
            except Exception as error:
                if self._closed.is_set():
                    return
                failure = SkywardError(f"node {node} was lost and could not be replaced "
                                       f"({REPLACE_ATTEMPTS} attempts): {error}")
                failure.__cause__ = error
                self.error = failure
                self._emit(ev.NodeRemoved(node, f"replacement failed: {error}"))
                return
            self._emit(ev.NodeAdded(node, "replacement"))
            if self.queue is not None:
                self.queue.pump()
        finally:
            with self._changed:
                self._replacing.discard(node)
                self._adding -= 1
                self._changed.notify_all()

    def _grow_in_place(self, node: int) -> None:
        """One try at a new node numbered ``node`` (none once the pool is closing)."""
        if self._closed.is_set():
            raise SkywardError("the pool is closing")
        self.nodes.reserve(1, [node])
        self.nodes.grow([node])

    # -- threads -----------------------------------------------------------------------------
    def _begin_add(self, count: int) -> None:
        with self._changed:
            self._adding += count

    def _end_add(self, count: int) -> None:
        with self._changed:
            self._adding -= count
            self._changed.notify_all()

    def _spawn(self, target: Callable[[], Any], name: str) -> None:
        with self._changed:
            if self._closed.is_set():
                return
            thread = threading.Thread(target=target, name=name, daemon=True)
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
            thread.start()

    def stop(self, timeout: float) -> list[str]:
        """Stop scaling and replacing, and wait (``timeout`` seconds at most) for what is under
        way to finish or release what it acquired; the problems, if it could not."""
        with self._changed:
            self._closed.set()
            self.nodes.closing = True
            threads = list(self._threads)
            self._changed.notify_all()
        self.nodes.abort_joining()
        deadline = time.monotonic() + timeout
        late = []
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                late.append(thread.name)
        return [f"{name} did not finish within {timeout:g}s" for name in late]
