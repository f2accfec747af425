"""Several worker processes per node (``processes_per_node``), on Local and on SSH test hosts:
one result per process in global rank order, torchrun's variables, one process group over all
processes, sharding by global rank, work spread over every process, a dead process named."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import cloudpickle
import pytest

import skyward as sky
from tests.conftest import wait_gone
from tests.hosts.conftest_fixture import ssh_provider

cloudpickle.register_pickle_by_value(__import__(__name__))  # the hosts cannot import tests/

NODES, PROCESSES = 2, 2
WORLD = NODES * PROCESSES


@pytest.fixture(scope="module", params=("local", "ssh"))
def pool(request: pytest.FixtureRequest) -> Iterator[sky.ComputePool]:
    options = dict(nodes=NODES, processes_per_node=PROCESSES, console=False,
                   plugins=[sky.plugins.torch(backend="gloo")])
    if request.param == "ssh":
        hosts = request.getfixturevalue("test_hosts")[:NODES]
        # numpy and torch come from the hosts' own Python (the wheelhouse has neither)
        options["provider"] = ssh_provider(hosts, request.getfixturevalue("wheelhouse"),
                                           system_site_packages=["numpy", "torch"])
    with sky.ComputePool(**options) as shared:
        yield shared


@sky.compute
def whoami() -> dict:
    info = sky.instance_info()
    names = ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID")
    return {"node": info.node, "local_rank": info.local_rank, "rank": info.rank, "world_size": info.world_size,
            "processes_per_node": info.processes_per_node, "pid": os.getpid(),
            "env": {name: os.environ.get(name) for name in names}}


@sky.compute
def all_reduce_of_ranks() -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return float(t.item())


@sky.compute
def my_share(n: int) -> list[int]:
    return list(sky.shard(list(range(n))))


@sky.compute
def rank_after(seconds: float) -> int:
    time.sleep(seconds)
    return sky.instance_info().rank


@sky.compute
def hold_then_rank(seconds: float) -> int:
    time.sleep(seconds)
    return sky.instance_info().rank


def test_a_broadcast_gives_one_result_per_process_in_global_rank_order(pool: sky.ComputePool) -> None:
    results = whoami() @ pool
    assert [(r["node"], r["local_rank"], r["rank"]) for r in results] == [
        (n, k, n * PROCESSES + k) for n in range(NODES) for k in range(PROCESSES)]
    assert {(r["world_size"], r["processes_per_node"]) for r in results} == {(WORLD, PROCESSES)}
    assert len({r["pid"] for r in results}) == WORLD  # a process each
    assert [r["env"]["RANK"] for r in results] == [str(i) for i in range(WORLD)]
    assert [r["env"]["LOCAL_RANK"] for r in results] == ["0", "1", "0", "1"]
    assert [r["env"]["GROUP_RANK"] for r in results] == ["0", "0", "1", "1"]
    assert {r["env"]["LOCAL_WORLD_SIZE"] for r in results} == {str(PROCESSES)}
    assert {r["env"]["WORLD_SIZE"] for r in results} == {str(WORLD)}
    assert len({r["env"]["TORCHELASTIC_RUN_ID"] for r in results}) == 1
    assert pool.worker_pids() == [r["pid"] for r in results]


def test_one_process_group_spans_every_process(pool: sky.ComputePool) -> None:
    assert all_reduce_of_ranks() @ pool == [float(sum(range(WORLD)))] * WORLD


def test_shard_splits_by_global_rank(pool: sky.ComputePool) -> None:
    shares = my_share(10) @ pool
    assert sorted(x for share in shares for x in share) == list(range(10))
    assert shares == [list(sky.shard(list(range(10)), node=r, total_nodes=WORLD)) for r in range(WORLD)]


def test_gather_and_rshift_spread_over_every_process(pool: sky.ComputePool) -> None:
    ranks = sky.gather(*(rank_after(0.3) for _ in range(WORLD))) >> pool
    assert sorted(ranks) == list(range(WORLD))  # all at once: one on each process
    held = [hold_then_rank(0.5) > pool for _ in range(WORLD - 1)]
    assert rank_after(0) >> pool not in [f.result() for f in held]  # >> took the free one


def test_a_shell_command_runs_once_per_node_and_sees_the_processes_per_node(pool: sky.ComputePool) -> None:
    results = sky.shell("echo slots=$SKYWARD_NUM_GPUS_PER_NODE node=$SKYWARD_NODE_RANK") @ pool
    assert [(r.node, r.output.strip()) for r in results] == [
        (n, f"slots={PROCESSES} node={n}") for n in range(NODES)]


def test_a_dead_process_fails_the_broadcast_promptly_naming_node_and_local_rank(new_pool) -> None:
    with new_pool(processes_per_node=PROCESSES) as pool:
        pids = pool.worker_pids()
        killer = threading.Timer(1.0, os.kill, args=(pids[3], signal.SIGKILL))  # node 1, local rank 1
        killer.start()
        started = time.monotonic()
        with pytest.raises(sky.WorkerLost) as info:
            hold_then_rank(60) @ pool
        assert time.monotonic() - started < 10
        assert (info.value.node, info.value.local_rank) == (1, 1)
        assert "node 1 (local rank 1)" in str(info.value)
    assert wait_gone([p for p in pids if p], 10) == []
