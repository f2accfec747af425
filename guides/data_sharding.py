"""Data sharding: every node gets the whole dataset and keeps its own part with ``sky.shard``.

The pattern behind data-parallel work without a framework: broadcast the data once with ``@``
(it is serialized once, whatever the number of nodes), let each node pick its share, compute a
partial result, and combine the partial results on the client. Here: a least-squares fit whose
normal equations ``X^T X`` and ``X^T y`` are sums over rows, so every node sums over its own
rows and the client adds the sums up. The answer equals the fit on all the data at once.

``shard(x, y)`` splits several arrays with the same positions, so rows stay paired;
``shuffle=True, seed=...`` gives a random split that every node agrees on (the same seed on
every node); ``drop_last=True`` gives every node exactly the same number of rows (what a
training loop with equal-sized steps needs).

    python guides/data_sharding.py
"""

import numpy as np

import skyward as sky


@sky.compute
def normal_equations(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """This node's share of X^T X and X^T y."""
    mine_x, mine_y = sky.shard(x, y, shuffle=True, seed=0)
    return mine_x.T @ mine_x, mine_x.T @ mine_y, len(mine_x)


@sky.compute
def equal_steps(n: int, batch: int) -> int:
    """How many full batches this node gets when every node must take the same number of steps."""
    rows = sky.shard(np.arange(n), drop_last=True)
    return len(rows) // batch


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    x = np.hstack([rng.normal(size=(50_001, 4)), np.ones((50_001, 1))])  # 4 features and an intercept
    true_w = np.array([1.5, -2.0, 0.5, 3.0, 0.25])
    y = x @ true_w + rng.normal(scale=0.1, size=len(x))

    with sky.ComputePool(nodes=3) as pool:
        parts = normal_equations(x, y) @ pool          # one (XtX, Xty, rows) per node
        steps = equal_steps(len(x), 64) @ pool

    xtx = sum(p[0] for p in parts)
    xty = sum(p[1] for p in parts)
    w = np.linalg.solve(xtx, xty)
    print("rows per node:", [p[2] for p in parts], "(together:", sum(p[2] for p in parts), "of", len(x), ")")
    print("weights from the shards:", np.round(w, 3))
    print("same as the fit on all rows:", bool(np.allclose(w, np.linalg.lstsq(x, y, rcond=None)[0])))
    print("equal steps on every node:", steps)
