"""Quickstart: estimate pi on a pool of 4 local worker processes.

Run it with ``python examples/quickstart.py``. It shows every way to send work to a pool:
``>>`` (one node), ``@`` (every node), ``&`` / ``sky.gather`` (concurrently), ``>``
(a future) and ``pool.map``.
"""

from __future__ import annotations

import random
import time

import skyward as sky


@sky.compute
def sample(points: int, seed: int) -> int:
    """Count random points of the unit square that fall inside the quarter circle."""
    rng = random.Random(seed)
    return sum(1 for _ in range(points) if rng.random() ** 2 + rng.random() ** 2 <= 1.0)


@sky.compute
@sky.stdout(only="head")
def describe() -> str:
    info = sky.instance_info()
    print(f"head here: {info.total_nodes} nodes, peers {[p.addr for p in info.peers]}")
    return f"node {info.node} of {info.total_nodes}"


def main() -> None:
    points, chunks = 200_000, 16
    started = time.perf_counter()
    with sky.ComputePool(nodes=4) as pool:
        print("one node:      ", describe() >> pool)
        print("every node:    ", describe() @ pool)
        a, b = (sample(1000, 1) & sample(1000, 2)) >> pool
        print("two at once:   ", a, b)
        future = sample(1000, 3) > pool
        print("a future:      ", future.result())
        hits = sky.gather(*(sample(points, seed) for seed in range(chunks))) >> pool
        squares = pool.map(lambda x: x * x, range(5))
        print("pool.map:      ", squares)
    pi = 4 * sum(hits) / (points * chunks)
    print(f"pi ~= {pi:.4f} from {points * chunks:,} points in {time.perf_counter() - started:.2f}s")
    assert abs(pi - 3.1416) < 0.01


if __name__ == "__main__":
    main()
