"""Large Local pools: the client's threads do not grow with the pool, and 256 nodes start, work
and end with nothing left."""

from __future__ import annotations

import threading

import pytest

import skyward as sky
from skyward.pool.starting import each
from tests.conftest import skyward_workers, wait_gone


@sky.compute
def node_number() -> int:
    return sky.instance_info().node


@sky.compute
def double(x: int) -> int:
    return 2 * x


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


def test_a_256_node_pool_starts_broadcasts_gathers_and_leaves_no_worker():
    with sky.ComputePool(nodes=256, console=False, start_timeout=300) as pool:
        workers = skyward_workers()
        assert len(workers) >= 256
        assert sorted(node_number() @ pool) == list(range(256))
        assert sky.gather(*(double(i) for i in range(3000))) >> pool == [2 * i for i in range(3000)]
    assert wait_gone(workers, 10) == []
    assert skyward_workers() == []


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
