"""Real torch.distributed (gloo) across Local worker processes: the torch plugin and the
``@sky.integrations.torch`` decorator set up a process group that DDP training can use."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
import torch
import torch.nn as nn

import skyward as sky
from skyward import integrations

STEPS = 4
PER_RANK = 6  # equal per-rank batches: the mean of the ranks' mean losses is the global mean loss
FEATURES, OUTPUTS = 5, 3
LR = 0.1
TORCHRUN_VARS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK")


@pytest.fixture(scope="module")
def pool2() -> Iterator[sky.ComputePool]:
    with sky.ComputePool(nodes=2, plugins=[sky.plugins.torch()], console=False) as pool:
        yield pool


@pytest.fixture(scope="module")
def pool3() -> Iterator[sky.ComputePool]:
    with sky.ComputePool(nodes=3, plugins=[sky.plugins.torch(backend="gloo")], console=False) as pool:
        yield pool


@pytest.fixture(params=[2, 3], ids=["2-nodes", "3-nodes"])
def torch_pool(request: pytest.FixtureRequest) -> sky.ComputePool:
    return request.getfixturevalue(f"pool{request.param}")


# -- tasks -----------------------------------------------------------------------------------------


@sky.compute
def describe() -> dict:
    import torch.distributed as dist

    info = sky.instance_info()
    return {
        "node": info.node,
        "head_port": info.head_port,
        "initialized": dist.is_initialized(),
        "rank": dist.get_rank() if dist.is_initialized() else None,
        "world": dist.get_world_size() if dist.is_initialized() else None,
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "env": {name: os.environ.get(name) for name in TORCHRUN_VARS},
    }


@sky.compute
def sum_of_ranks_plus_one() -> list[float]:
    import torch.distributed as dist

    value = torch.tensor([dist.get_rank() + 1.0, 1.0])
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value.tolist()


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Linear(FEATURES, OUTPUTS)


def global_batches(world: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1234)
    xs = torch.randn(STEPS, world * PER_RANK, FEATURES, generator=gen)
    ys = xs @ torch.randn(FEATURES, OUTPUTS, generator=gen) + 0.1 * torch.randn(STEPS, world * PER_RANK, OUTPUTS, generator=gen)
    return xs, ys


@sky.compute
def train_ddp(xs: torch.Tensor, ys: torch.Tensor) -> list[torch.Tensor]:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = dist.get_rank()
    # Each rank starts from different weights: DDP must broadcast rank 0's at construction.
    model = DDP(make_model(seed=rank))
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    mine = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
    for x, y in zip(xs, ys, strict=True):
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
        optimizer.step()
    return [p.detach().clone() for p in model.module.parameters()]


def train_single_process(xs: torch.Tensor, ys: torch.Tensor) -> list[torch.Tensor]:
    model = make_model(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for x, y in zip(xs, ys, strict=True):
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


@sky.compute
@integrations.torch
def rank_via_decorator() -> tuple[int, int, float]:
    import torch.distributed as dist

    value = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(value)
    return dist.get_rank(), dist.get_world_size(), value.item()


@sky.compute
@integrations.torch(backend="gloo")
def backend_via_decorator() -> tuple[int, str]:
    import torch.distributed as dist

    return dist.get_world_size(), dist.get_backend()


# -- the plugin ------------------------------------------------------------------------------------


def test_each_node_gets_its_rank_and_the_torchrun_variables(torch_pool: sky.ComputePool) -> None:
    results = describe() @ torch_pool
    n = torch_pool.nodes
    port = str(results[0]["head_port"])
    for node, r in enumerate(results):
        assert (r["node"], r["initialized"], r["rank"], r["world"], r["backend"]) == (node, True, node, n, "gloo")
        assert r["env"] == {
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": str(n), "RANK": str(node),
            # One process per node: local ranks are per node, as torchrun sets them.
            "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "NODE_RANK": str(node),
        }


def test_all_reduce_sums_over_every_rank(torch_pool: sky.ComputePool) -> None:
    n = torch_pool.nodes
    assert sum_of_ranks_plus_one() @ torch_pool == [[n * (n + 1) / 2, float(n)]] * n


def test_ddp_replicas_stay_identical_and_match_one_process_on_the_global_batch(torch_pool: sky.ComputePool) -> None:
    xs, ys = global_batches(torch_pool.nodes)
    per_rank = train_ddp(xs, ys) @ torch_pool
    head = per_rank[0]
    for params in per_rank[1:]:
        assert all(torch.equal(a, b) for a, b in zip(head, params, strict=True))
    reference = train_single_process(xs, ys)
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(head, reference, strict=True))
    # The training moved the weights: comparing two untouched initialisations would prove nothing.
    assert not torch.allclose(reference[0], make_model(seed=0).weight.detach())


def test_a_single_node_pool_initialises_nothing() -> None:
    with sky.ComputePool(nodes=1, plugins=[sky.plugins.torch()], console=False) as pool:
        result = describe() >> pool
    assert result["initialized"] is False
    assert result["env"] == {name: os.environ.get(name) for name in TORCHRUN_VARS}  # as the client had them


def test_the_timeout_bounds_a_collective_a_peer_never_joins() -> None:
    with sky.ComputePool(nodes=2, plugins=[sky.plugins.torch(timeout=2)], console=False) as pool:
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="Timed out waiting 2000ms"):
            lonely_all_reduce() @ pool
        assert time.monotonic() - started < 30


@sky.compute
def lonely_all_reduce() -> None:
    import torch.distributed as dist

    if dist.get_rank() == 1:
        dist.all_reduce(torch.ones(1))  # rank 0 never joins


@pytest.mark.may_skip("runs only where CUDA is not available")
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_nccl_without_cuda_fails_at_start_naming_the_plugin() -> None:
    with pytest.raises(sky.PluginError) as info:
        with sky.ComputePool(nodes=2, plugins=[sky.plugins.torch(backend="nccl")], console=False):
            pass
    assert info.value.plugin == "torch" and info.value.hook == "around_app"
    assert "nccl" in str(info.value)


# -- the decorator -----------------------------------------------------------------------------------


def test_the_decorator_initialises_once_per_worker_without_the_plugin() -> None:
    with sky.ComputePool(nodes=2, console=False) as pool:
        assert [r["initialized"] for r in describe() @ pool] == [False, False]
        first = rank_via_decorator() @ pool
        # A second call would fail if it initialised again ("initialize ... twice").
        second = rank_via_decorator() @ pool
        # The group outlives the task: an undecorated task can use it.
        later = describe() @ pool
    assert first == second == [(0, 2, 1.0), (1, 2, 1.0)]
    assert [(r["rank"], r["env"]["RANK"], r["env"]["WORLD_SIZE"]) for r in later] == [(0, "0", "2"), (1, "1", "2")]


def test_the_decorator_does_nothing_when_the_plugin_already_initialised(pool2: sky.ComputePool) -> None:
    assert backend_via_decorator() @ pool2 == [(2, "gloo"), (2, "gloo")]
    assert rank_via_decorator() @ pool2 == [(0, 2, 1.0), (1, 2, 1.0)]


@sky.compute
@integrations.torch
def initialized_here() -> bool:
    import torch.distributed as dist

    return dist.is_initialized()


def test_the_decorator_outside_a_pool_initialises_nothing() -> None:
    assert initialized_here.local() is False
    assert initialized_here.fn.__name__ == "initialized_here"  # functools.wraps kept the name


@sky.compute
def thread_settings() -> tuple[int, str | None]:
    import os

    import torch

    return torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")


def test_ranks_sharing_a_host_share_its_cpus() -> None:
    expected = max(1, (os.cpu_count() or 1) // 2)
    with sky.ComputePool(nodes=2, console=False, plugins=[sky.plugins.torch(backend="gloo")]) as pool:
        assert thread_settings() @ pool == [(expected, str(expected))] * 2


def test_an_explicit_omp_num_threads_wins() -> None:
    image = sky.Image(env={"OMP_NUM_THREADS": "3"})
    with sky.ComputePool(nodes=2, console=False, image=image, plugins=[sky.plugins.torch(backend="gloo")]) as pool:
        assert [env for _, env in thread_settings() @ pool] == ["3", "3"]
