"""JAX on two nodes: every node takes the gradient on its shard, the client averages them.

``sky.plugins.jax()`` installs JAX on each node and, on a pool of two or more nodes, joins the
workers into one JAX cluster (``jax.distributed.initialize``) before any task runs: inside a
task ``jax.process_index()`` is this node's number and ``jax.process_count()`` the node count.

The job: fit ``y = X @ w`` by full-batch gradient descent. The data set is broadcast once per
step with the current weights; ``sky.shard`` gives each node its half of the rows;
``jax.value_and_grad`` (compiled with ``jax.jit``) runs there; the client adds the partial
losses and gradients up and takes the step. The result is compared with the least-squares
solution computed here.

Runs on this machine's CPU (two Local nodes)::

    pip install jax
    python guides/jax_linear_regression.py
"""

import numpy as np

import skyward as sky


@sky.compute
def partial_gradient(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[int, int, float, np.ndarray]:
    """This node's share of the mean squared error and its gradient (sums, not means)."""
    import jax
    import jax.numpy as jnp

    xs, ys = sky.shard(x, y)  # this node's rows

    @jax.jit
    def sum_of_squares(w: jax.Array) -> jax.Array:
        return jnp.sum((xs @ w - ys) ** 2)

    loss, grad = jax.value_and_grad(sum_of_squares)(jnp.asarray(w))
    return jax.process_index(), len(xs), float(loss), np.asarray(grad)


def main(steps: int = 60) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4_000, 8)).astype(np.float32)
    true_w = rng.normal(size=8).astype(np.float32)
    y = (x @ true_w + 0.1 * rng.normal(size=4_000)).astype(np.float32)
    w = np.zeros(8, dtype=np.float32)

    with sky.ComputePool(nodes=2, plugins=[sky.plugins.jax()]) as pool:
        for step in range(steps):
            parts = partial_gradient(x, y, w) @ pool  # one result per node
            rows = sum(n for _, n, _, _ in parts)
            loss = sum(loss for _, _, loss, _ in parts) / rows
            grad = sum(g for _, _, _, g in parts) / rows
            w = w - 0.2 * grad
            if step % 20 == 0:
                print(f"step {step}: mse {loss:.4f} (nodes {[p for p, *_ in parts]}, {rows} rows)")

    best = np.linalg.lstsq(x, y, rcond=None)[0]
    gap = float(np.abs(w - best).max())
    print(f"largest difference from least squares: {gap:.2e}")
    print(f"matches the least-squares fit: {gap < 1e-3}")


if __name__ == "__main__":
    main()
