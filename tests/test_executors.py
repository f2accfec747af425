"""The worker's executors: what runs tasks, apart from the agent that reads the stream."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

import skyward as sky
from tests.test_imports import import_graph


@pytest.fixture(scope="module")
def pool1() -> Iterator[sky.ComputePool]:
    with sky.ComputePool(nodes=1, console=False) as pool:
        yield pool


@sky.compute(timeout=0.5)
def swallow_everything(seconds: float) -> str:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            time.sleep(0.01)
        except Exception:  # a task that means to keep going whatever happens
            pass
    return "ran to the end"


@sky.compute
def echo(x: int) -> int:
    return x


def test_a_task_cannot_swallow_its_stop_with_except_exception(pool1: sky.ComputePool) -> None:
    with pytest.raises(sky.TaskTimeout):
        swallow_everything(30) >> pool1
    # One slot: the next task starts only once the stopped one has really ended.
    started = time.monotonic()
    assert (echo(7) > pool1).result(timeout=10) == 7
    assert time.monotonic() - started < 5


def test_the_executors_know_the_agent_only_through_their_interface() -> None:
    graph = import_graph()
    executors = [m for m in graph if m.startswith("skyward.worker.executors")]
    assert executors
    for module in executors:
        assert "skyward.worker.agent" not in graph[module], module
    assert "skyward.worker.executors" in graph["skyward.worker.agent"]
