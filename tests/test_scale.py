"""Large Local pools: the client's threads do not grow with the pool; 256 nodes start, work, go
on when one of them goes silent, and end with nothing left. (A client killed, or interrupted
while 512 nodes start: tests/faults/test_scale.py.)"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

import skyward as sky
from skyward.events import NodeStage
from skyward.pool import ioloop
from skyward.pool.starting import each
from tests.conftest import skyward_workers, wait_gone


@sky.compute
def node_number() -> int:
    return sky.instance_info().node


@sky.compute
def double(x: int) -> int:
    return 2 * x


@sky.compute
def node_of(_: int) -> int:
    return sky.instance_info().node


#: The 256-node pool's idle_timeout (seconds): small, so that a silent node is named soon, yet
#: long enough that 256 workers sharing 2 loaded cores do not miss that many heartbeats (5 s did,
#: once, at a 1-minute load average of 160; 10 s did once with two whole suites running beside it).
IDLE_TIMEOUT = 20.0
#: After idle_timeout, how long noticing the silence and failing the broadcast may take.
NOTICE = 10.0


def threads_of_an_open_pool(nodes: int) -> int:
    """How many more threads this process has while a pool of ``nodes`` is open than before."""
    before = threading.active_count()
    with sky.ComputePool(nodes=nodes, console=False, start_timeout=300) as pool:
        assert sorted(node_number() @ pool) == list(range(nodes))
        during = threading.active_count()
    return during - before


def test_a_pool_adds_the_same_few_threads_at_8_and_at_128_nodes():
    threading.Thread(target=lambda: None).start()  # (the interpreter's own first-thread setup)
    small = threads_of_an_open_pool(8)
    large = threads_of_an_open_pool(128)
    assert large - small <= 1, f"8 nodes: {small} threads more, 128 nodes: {large} more"
    assert large <= 3, f"a 128-node pool holds {large} threads more than none"


@sky.compute
def node_and_pid() -> tuple[int, int]:
    return sky.instance_info().node, os.getpid()


def test_a_256_node_pool_starts_works_names_a_silent_node_and_the_other_255_go_on():
    # (One test, not two, for the CI's time: a 256-node start costs 15-30 s on 2 cores.)
    silent = 137
    with sky.ComputePool(nodes=256, idle_timeout=IDLE_TIMEOUT, console=False, start_timeout=300) as pool:
        workers = skyward_workers()
        assert len(workers) >= 256
        pids = dict(node_and_pid() @ pool)
        assert sorted(pids) == list(range(256))
        assert sky.gather(*(double(i) for i in range(3000))) >> pool == [2 * i for i in range(3000)]
        os.kill(pids[silent], signal.SIGSTOP)  # node 137 goes silent: no end of stream, no exit
        stopped = time.monotonic()
        with pytest.raises(sky.WorkerLost, match=f"node {silent}: .*no heartbeat"):
            node_and_pid() @ pool
        named_after = time.monotonic() - stopped
        assert named_after < IDLE_TIMEOUT + NOTICE, f"node {silent} was named {named_after:.1f}s after it went silent"
        ran_on = set(sky.gather(*(node_of(i) for i in range(2550))) >> pool)
        assert silent not in ran_on and len(ran_on) > 128, sorted(set(range(256)) - ran_on)
    assert wait_gone(workers, 10) == []
    assert skyward_workers() == []


def test_a_node_is_not_lost_while_the_client_itself_cannot_listen():
    # A client starved of CPU (a thousand workers starting beside it) reads nothing for a while:
    # its workers' heartbeats wait in their pipes. Here the I/O loop is held for twice
    # idle_timeout, and neither node may be declared lost for that.
    lost: list[NodeStage] = []
    on_event = lambda e: lost.append(e) if isinstance(e, NodeStage) and e.stage == "lost" else None  # noqa: E731
    with sky.ComputePool(nodes=2, idle_timeout=4, heartbeat_interval=0.5, console=False, on_event=on_event) as pool:
        before = dict(node_and_pid() @ pool)
        holding, held = threading.Event(), threading.Event()

        def hold() -> None:
            holding.set()
            threading.Event().wait(8.0)  # the loop's thread, away for 8 s
            held.set()

        ioloop.get().call_soon(hold)
        assert holding.wait(30) and held.wait(60)
        assert dict(node_and_pid() @ pool) == before, lost
    assert lost == []


def test_nodes_start_start_parallelism_at_a_time_and_the_first_failure_is_raised_after_all_end():
    together = threading.Barrier(3, timeout=30)  # (broken, and raising, unless 3 run at once)
    lock = threading.Lock()
    running, most, ended = [0], [0], []

    def step(k: int) -> int:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            if k < 3:
                together.wait()
            if k == 4:
                raise ValueError("node 4 failed")
            return k
        finally:
            with lock:
                running[0] -= 1
                ended.append(k)

    assert each(step, [(k,) for k in range(3)], 3) == [0, 1, 2]
    with pytest.raises(ValueError, match="node 4 failed"):
        each(step, [(k,) for k in range(3, 9)], 3)
    assert most[0] == 3
    assert sorted(ended) == list(range(9))
