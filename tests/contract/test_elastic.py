"""Elastic pools on every provider: a queue grows the pool to ``max``, idle nodes go down to
``min`` leaving nothing behind, a lost node (killed or silent) is replaced, a task with
``retries`` gives its result on another node and one without raises ``WorkerLost``.

Local runs worker processes here; SSH uses the two test hosts (the host list is the pool's
capacity). The hosts share this machine's /tmp and process ids, so a task's files and pids
are read here.
"""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
from concurrent.futures import Future
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import skyward as sky
from skyward import events as ev
from tests.contract.conftest import PROVIDERS
from tests.contract.elastic_tasks import (
    die_once,
    fail_counting,
    held_while,
    hold_unless_head,
    leave_a_process,
    node_and_pid,
    pause_then,
)
from tests.hosts.conftest_fixture import ssh_provider, venv_site_env

IDLE_TIMEOUT = 4.0
#: Seconds a test waits for a change that takes about one (a node added, a node released).
SETTLES_WITHIN = 30.0


class Elastic:
    """Makes elastic pools on one provider and records their membership events."""

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self.provider = request.param
        self.hosts = request.getfixturevalue("test_hosts")[:2] if self.provider == "ssh" else []
        self._wheelhouse = request.getfixturevalue("wheelhouse") if self.hosts else ""
        self.events: list[ev.Event] = []
        self._changed = threading.Condition()

    def pool(self, **kw) -> sky.ComputePool:
        kw = {"console": False, "idle_timeout": IDLE_TIMEOUT, "on_event": self._on_event, **kw}
        if self.provider == "local":
            return sky.ComputePool(**kw)
        image = sky.Image().with_env(**venv_site_env("numpy")) if venv_site_env("numpy") else sky.Image()
        return sky.ComputePool(provider=ssh_provider(self.hosts, self._wheelhouse), image=image, **kw)

    def _on_event(self, event: ev.Event) -> None:
        if isinstance(event, (ev.NodeAdded, ev.NodeRemoved, ev.TaskRetried)):
            with self._changed:
                self.events.append(event)
                self._changed.notify_all()

    def of(self, kind: type) -> list:
        with self._changed:
            return [e for e in self.events if isinstance(e, kind)]

    def wait_for(self, predicate: Callable[[], bool], timeout: float = SETTLES_WITHIN) -> bool:
        with self._changed:
            return self._changed.wait_for(predicate, timeout)


@pytest.fixture(params=PROVIDERS)
def elastic(request: pytest.FixtureRequest) -> Iterator[Elastic]:
    yield Elastic(request)


@pytest.fixture
def marker() -> Iterator[str]:
    path = f"/tmp/skyward-elastic-{uuid.uuid4().hex[:10]}"
    yield path
    for f in Path("/tmp").glob(Path(path).name + "*"):
        f.unlink(missing_ok=True)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


def test_waiting_tasks_grow_the_pool_to_max(elastic: Elastic) -> None:
    with elastic.pool(nodes=(1, 2), scale_up_after=0.5) as pool:
        assert pool.nodes == 1 and (pool.min_nodes, pool.max_nodes) == (1, 2)
        results = pool.map(lambda i: pause_then.fn(i, 1.0), range(12))
        assert results == list(range(12))
        # (an SSH host takes seconds to prepare: the queue may be done first)
        assert elastic.wait_for(lambda: bool(elastic.of(ev.NodeAdded)))
        assert pool.nodes == 2
        added = elastic.of(ev.NodeAdded)
        assert [e.node for e in added] == [1] and added[0].reason.startswith("scale-up: ")
        # one result per node now: the new node is a member like the first
        assert sorted(n for n, total, _ in node_and_pid() @ pool) == [0, 1]


def pids_of(path: str) -> list[int]:
    return [int(p) for p in Path(path).read_text().split()]


def test_idle_nodes_are_released_down_to_min_leaving_no_process(elastic: Elastic, marker: str) -> None:
    with elastic.pool(nodes=(1, 2), scale_up_after=0.3, scale_down_after=1.5) as pool:
        sky.gather(*(pause_then(i, 1.0) for i in range(6))) >> pool
        assert pool.nodes == 2
        # on each node, a process in a session of its own, as a task's daemon would be
        assert sorted(leave_a_process(marker) @ pool) == [0, 1]
        assert elastic.wait_for(lambda: any(isinstance(e, ev.NodeRemoved) for e in elastic.events))
        assert pool.nodes == 1
        [removed] = elastic.of(ev.NodeRemoved)
        assert removed.reason == "idle 1.5s"
        kept = 1 - removed.node
        assert [pid for pid in pids_of(f"{marker}-{removed.node}") if not gone(pid)] == []
        assert not any(gone(pid) for pid in pids_of(f"{marker}-{kept}"))
        time.sleep(2.0)  # idle again: never below min
        assert pool.nodes == 1 and len(elastic.of(ev.NodeRemoved)) == 1
        assert [n for n, _, _ in node_and_pid() @ pool] == [kept]
    assert [pid for pid in pids_of(f"{marker}-{kept}") if not gone(pid)] == []


def test_a_killed_worker_is_replaced_under_its_node_number(elastic: Elastic) -> None:
    with elastic.pool(nodes=(2, 2)) as pool:
        before = sorted(node_and_pid() @ pool)
        os.kill(before[1][2], signal.SIGKILL)
        assert elastic.wait_for(lambda: bool(elastic.of(ev.NodeAdded)))
        pool.wait_ready(timeout=SETTLES_WITHIN)
        [removed] = elastic.of(ev.NodeRemoved)
        assert removed.node == 1 and removed.reason.startswith("lost: ") and removed.reason.endswith("; replacing")
        assert [(e.node, e.reason) for e in elastic.of(ev.NodeAdded)] == [(1, "replacement")]
        after = sorted(node_and_pid() @ pool)
        assert [(n, total) for n, total, _ in after] == [(0, 2), (1, 2)]
        assert after[0][2] == before[0][2] and after[1][2] != before[1][2]
        assert gone(before[1][2])


def test_a_silent_node_is_replaced_within_the_silent_limits(elastic: Elastic) -> None:
    # SSH: node 0's host is cut off, its replacement takes the other host (the cut one is
    # never used again); Local: node 0's worker is frozen (SIGSTOP), as a cut freezes it.
    with elastic.pool(nodes=(1, 1)) as pool:
        [(_, _, pid)] = node_and_pid() @ pool
        cut = elastic.hosts[0] if elastic.hosts else None
        try:
            silenced = time.monotonic()
            if cut is not None:
                cut.set_link(False)
            else:
                os.kill(pid, signal.SIGSTOP)
            assert elastic.wait_for(lambda: bool(elastic.of(ev.NodeAdded)), IDLE_TIMEOUT + SETTLES_WITHIN)
            pool.wait_ready(timeout=SETTLES_WITHIN)
            replaced_after = time.monotonic() - silenced
            [(node, total, new_pid)] = node_and_pid() @ pool
            assert (node, total) == (0, 1) and new_pid != pid
            if cut is not None:
                assert pool.instances[0].public_addr == elastic.hosts[1].ip
            # idle_timeout to notice, the silent-node stop limits (3 s each), then a start
            assert replaced_after < IDLE_TIMEOUT + 6 + 15, replaced_after
        finally:
            if cut is not None:
                cut.set_link(True)
    if cut is None:
        assert gone(pid)


@pytest.mark.parametrize("shape", ["fixed", "elastic"])
def test_a_task_with_retries_gives_its_result_after_its_node_is_lost(elastic: Elastic, marker: str,
                                                                      shape: str) -> None:
    # fixed: 2 nodes, the retry runs on the other one (the pool goes on smaller); elastic: 1
    # node, the retry waits in the queue for the lost node's replacement, twice
    nodes = 2 if shape == "fixed" else (1, 1)
    with elastic.pool(nodes=nodes) as pool:
        assert die_once(marker, 42).with_options(retries=2) >> pool == 42
        assert Path(marker).read_text() == "2"
        [retried] = elastic.of(ev.TaskRetried)
        assert (retried.name, retried.attempt, retried.attempts) == ("die_once", 2, 3)
        if shape == "elastic":
            Path(marker).unlink()
            future = sky.compute(retries=1)(die_once.fn)(marker, 7) > pool
            assert future.result(timeout=SETTLES_WITHIN) == 7
            assert pool.nodes == 1


@pytest.mark.parametrize("shape", ["fixed", "elastic"])
def test_a_task_without_retries_raises_worker_lost(elastic: Elastic, marker: str, shape: str) -> None:
    with elastic.pool(nodes=2 if shape == "fixed" else (1, 1)) as pool:
        with pytest.raises(sky.WorkerLost, match="killed by SIGKILL"):
            die_once(marker, 42) >> pool
        assert Path(marker).read_text() == "1"
        assert elastic.of(ev.TaskRetried) == []


def test_a_task_that_raises_is_never_retried(elastic: Elastic, marker: str) -> None:
    with elastic.pool(nodes=(1, 2)) as pool:
        with pytest.raises(ValueError, match="user code failed"):
            fail_counting(marker).with_options(retries=3) >> pool
        assert Path(marker).read_text() == "1"
        assert elastic.of(ev.TaskRetried) == []


def test_a_cancelled_queued_task_never_runs(elastic: Elastic, marker: str) -> None:
    with elastic.pool(nodes=(1, 1)) as pool:
        busy = pause_then(1, 1.5) > pool
        queued = fail_counting(marker) > pool  # waits in the client: the only slot is busy
        assert queued.cancel()
        assert busy.result() == 1
        assert (pause_then(2, 0.0) >> pool) == 2
        assert not Path(marker).exists()


def test_a_broadcast_that_loses_a_node_leaves_the_pool_usable_once_replaced(elastic: Elastic) -> None:
    # (the failed broadcast's own recovery must not race with the replacement and close the pool)
    with elastic.pool(nodes=(2, 2)) as pool:
        pid = sorted(node_and_pid() @ pool)[1][2]
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(sky.WorkerLost):
            node_and_pid() @ pool
        pool.wait_ready(timeout=SETTLES_WITHIN)
        assert pool.is_open
        assert sorted(n for n, _, _ in node_and_pid() @ pool) == [0, 1]


@pytest.mark.parametrize("shape", ["fixed", "elastic"])
def test_a_broadcast_while_a_lost_node_is_replaced_waits_for_the_replacement(elastic: Elastic, shape: str) -> None:
    # (a broadcast on fewer nodes would form a smaller DDP world by accident)
    nodes = 2 if shape == "fixed" else (2, 2)
    with elastic.pool(nodes=nodes, replace_lost=True) as pool:
        pid = sorted(node_and_pid() @ pool)[1][2]
        os.kill(pid, signal.SIGKILL)
        assert elastic.wait_for(lambda: bool(elastic.of(ev.NodeRemoved)))
        # the lost node is released, its replacement starting: the broadcast waits for it
        assert sorted((n, total) for n, total, _ in node_and_pid() @ pool) == [(0, 2), (1, 2)]
        assert [(e.node, e.reason) for e in elastic.of(ev.NodeAdded)] == [(1, "replacement")]


def test_a_broadcast_waits_for_a_replacement_at_most_start_timeout(elastic: Elastic, marker: str) -> None:
    start_timeout = 5.0
    hold = sky.Plugin("hold", around_app=functools.partial(held_while, marker))
    with elastic.pool(nodes=2, replace_lost=True, start_timeout=start_timeout, plugins=[hold]) as pool:
        pid = sorted(node_and_pid() @ pool)[1][2]
        Path(marker).touch()  # the replacement's worker will not start until it is gone
        os.kill(pid, signal.SIGKILL)
        assert elastic.wait_for(lambda: bool(elastic.of(ev.NodeRemoved)))
        started = time.monotonic()
        with pytest.raises(sky.BootstrapError, match=r"not ready within start_timeout=5s") as info:
            node_and_pid() @ pool
        assert info.value.node == 1
        assert start_timeout - 0.5 < time.monotonic() - started < start_timeout + 5.0
        Path(marker).unlink()  # the next attempt starts: the pool is whole again
        pool.wait_ready(timeout=SETTLES_WITHIN)
        assert sorted(n for n, _, _ in node_and_pid() @ pool) == [0, 1]


def test_an_autoscaling_pool_at_min_or_above_broadcasts_to_the_nodes_it_has(elastic: Elastic, marker: str) -> None:
    hold = sky.Plugin("hold", around_app=functools.partial(held_while, marker))
    with elastic.pool(nodes=(1, 2), scale_up_after=0.3, plugins=[hold]) as pool:
        sky.gather(*(pause_then(i, 1.0) for i in range(6))) >> pool
        assert elastic.wait_for(lambda: bool(elastic.of(ev.NodeAdded)))
        pid = sorted(node_and_pid() @ pool)[1][2]
        Path(marker).touch()  # node 1's replacement stays starting
        os.kill(pid, signal.SIGKILL)
        assert elastic.wait_for(lambda: bool(elastic.of(ev.NodeRemoved)))
        assert [n for n, _, _ in node_and_pid() @ pool] == [0]


def test_scaling_down_keeps_node_0_when_a_higher_node_is_the_busy_one(elastic: Elastic, marker: str) -> None:
    # node 0 idle while node 1 holds a task: node 0 (torch's MASTER_ADDR) must not be released
    idle_after = 1.0
    with elastic.pool(nodes=(1, 2), scale_up_after=0.3, scale_down_after=idle_after) as pool:
        sky.gather(*(pause_then(i, 1.0) for i in range(6))) >> pool
        assert elastic.wait_for(lambda: bool(elastic.of(ev.NodeAdded)))
        # two tasks at a time until one holds node 1 (node 0 answers at once, and may take both)
        sent: list[Future[int]] = []
        deadline = time.monotonic() + SETTLES_WITHIN
        while not os.path.exists(marker + ".held"):
            assert time.monotonic() < deadline, "no task reached node 1"
            while sum(not f.done() for f in sent) < 2:
                sent.append(hold_unless_head(marker) > pool)
            time.sleep(0.02)
        while sum(not f.done() for f in sent) > 1:  # the other one, if any, is node 0's: answered at once
            assert time.monotonic() < deadline, "node 0 did not answer"
            time.sleep(0.02)
        [held] = [f for f in sent if not f.done()]  # node 1's; node 0 is idle from now on
        assert [f.result() for f in sent if f is not held] == [0] * (len(sent) - 1)
        # node 0 idle for 3 x scale_down_after while node 1 is busy: nothing is released
        assert not elastic.wait_for(lambda: bool(elastic.of(ev.NodeRemoved)), 3 * idle_after)
        Path(marker).touch()
        assert held.result(timeout=SETTLES_WITHIN) == 1
        assert elastic.wait_for(lambda: bool(elastic.of(ev.NodeRemoved)))
        assert [(e.node, e.reason) for e in elastic.of(ev.NodeRemoved)] == [(1, f"idle {idle_after:g}s")]
        assert [n for n, _, _ in node_and_pid() @ pool] == [0]
