"""Runtime patterns: who am I, which data is mine, and who gets to print.

Inside a task, ``sky.instance_info()`` says where this node sits in the pool, ``sky.shard``
picks this node's part of the data, and ``@sky.stdout`` / ``@sky.stderr`` / ``@sky.silent``
decide which nodes' output reaches your terminal. None of this needs a framework plugin; it
works the same on Local processes, SSH hosts and cloud machines (and outside a pool, where
the caller is node 0 of 1).

    python guides/runtime_patterns.py
"""

import numpy as np

import skyward as sky


@sky.compute
def whoami() -> dict:
    """Every node prints; the console prefixes each line with its node."""
    info = sky.instance_info()
    role = "head" if info.is_head else "worker"
    print(f"I am node {info.node} of {info.total_nodes} ({role}); head at {info.head_addr}:{info.head_port}")
    return {"node": info.node, "peers": [(p.node, p.addr) for p in info.peers], "gpus": info.accelerators}


@sky.compute
@sky.stdout(only="head")  # every node computes, only node 0 talks
def partial_stats(values: np.ndarray) -> dict:
    # Every node receives all of `values`; shard keeps this node's part. The positions come
    # along so we can check that the parts cover the data exactly once. `shuffle=True` with
    # the same seed on every node: a random split that the nodes agree on.
    positions, mine = sky.shard(np.arange(len(values)), values, shuffle=True, seed=7)
    print(f"head: my shard has {len(mine)} of {len(values)} values")
    return {"positions": positions, "sum": float(mine.sum()), "count": len(mine)}


@sky.compute
@sky.silent  # nothing from this task reaches the terminal, on any node
def noisy_preprocessing(n: int) -> int:
    for step in range(n):
        print(f"very chatty progress line {step}")
    return n * (sky.instance_info().node + 1)


@sky.compute
@sky.stdout(only=lambda info: info.node < 2)  # a predicate over InstanceInfo: nodes 0 and 1 only
def debug_first_two() -> int:
    info = sky.instance_info()
    print(f"debug output from node {info.node}")
    return info.node


@sky.compute
def save_checkpoint(step: int) -> str:
    """The head-node pattern: all nodes run it, only the head does the singular work."""
    info = sky.instance_info()
    if info.is_head:
        return f"node {info.node} wrote checkpoint-{step}"
    return f"node {info.node} skipped (not the head)"


if __name__ == "__main__":
    values = np.random.default_rng(0).normal(loc=3.0, size=10_001)

    with sky.ComputePool(nodes=3) as pool:
        print("-- instance_info() on every node")
        nodes = whoami() @ pool
        print("peers seen by node 0:", nodes[0]["peers"])

        print("-- sky.shard(..., shuffle=True, seed=7), head-only output")
        parts = partial_stats(values) @ pool
        covered = np.sort(np.concatenate([p["positions"] for p in parts]))
        print("shard sizes:", [p["count"] for p in parts],
              "| every value exactly once:", bool((covered == np.arange(len(values))).all()))
        mean = sum(p["sum"] for p in parts) / sum(p["count"] for p in parts)
        print(f"mean from the parts {mean:.6f} == mean of all {values.mean():.6f}")

        print("-- @sky.silent: no output, results still come back")
        print("results:", noisy_preprocessing(1000) @ pool)

        print("-- @sky.stdout(only=lambda info: info.node < 2)")
        print("results:", debug_first_two() @ pool)

        print("-- head-only work")
        for line in save_checkpoint(100) @ pool:
            print(line)
