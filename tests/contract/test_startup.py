"""A pool starts at any size and under any load: the client's heartbeats never reach a worker
before its SETUP (the first frame a worker reads, the one that arms its dead man's switch),
however long starting the other workers takes."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import skyward as sky
from tests.contract.tasks import echo, node_of

#: Workers per pool in the many-workers test: Local runs 128 nodes; the SSH test hosts are two,
#: so they run 16 worker processes each (``processes_per_node``): 32 connections.
MANY = {"local": {"nodes": 128}, "ssh": {"processes_per_node": 16}}


def test_heartbeats_faster_than_the_workers_start_do_not_break_the_start(
        new_pool: Callable[..., sky.ComputePool]) -> None:
    """Ten heartbeats before the last of 8 workers is even started: none may come first."""
    with new_pool(processes_per_node=4, heartbeat_interval=0.005) as pool:
        assert len(echo(1) @ pool) == 8


@pytest.mark.timeout(300)
def test_many_workers_start_and_serve_a_broadcast_and_a_gather(
        request: pytest.FixtureRequest, new_pool: Callable[..., sky.ComputePool]) -> None:
    options = MANY[request.node.callspec.params["new_pool"]]
    with new_pool(start_timeout=240, **options) as pool:
        workers = len(pool.worker_pids())
        nodes = options.get("nodes", 2)
        assert workers == nodes * options.get("processes_per_node", 1)
        ranks = node_of() @ pool
        assert sorted(set(ranks)) == list(range(nodes)) and len(ranks) == workers
        assert sky.gather(*(echo(i) for i in range(2 * workers))) >> pool == list(range(2 * workers))
