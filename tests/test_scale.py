"""Large Local pools: the client's threads do not grow with the pool, and 256 nodes start, work
and end with nothing left."""

from __future__ import annotations

import threading

import skyward as sky
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
