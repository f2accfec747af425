"""A gather sends each node its tasks in a few frames (TasksSent events), on real Local workers:
results in order, errors and output per task, and a node lost mid-batch has its tasks retried."""

from __future__ import annotations

import collections
import os

import pytest

import skyward as sky
from skyward import events as ev


@sky.compute
def square(x: int) -> int:
    return x * x


@sky.compute
def loud_or_broken(x: int) -> int:
    print(f"line of {x}")
    if x == 37:
        raise ValueError("thirty-seven")
    return x


@sky.compute(retries=1)
def square_or_die_once(x: int, marker: str) -> int:
    """Node 1's first task past the 60th ends its worker (once): its batch is cut in the middle."""
    if x >= 60 and sky.instance_info().node == 1:
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            pass
        else:
            os._exit(9)
    return x * x


def test_a_gather_sends_each_node_its_tasks_in_few_frames_and_answers_each_task() -> None:
    seen: list[ev.Event] = []
    with sky.ComputePool(nodes=2, console=False, on_event=seen.append) as pool:
        n = 1000
        assert sky.gather(*(square(i) for i in range(n))) >> pool == [i * i for i in range(n)]
        frames = collections.Counter(e.node for e in seen if isinstance(e, ev.TasksSent))
        tasks = collections.Counter()
        for e in seen:
            if isinstance(e, ev.TasksSent):
                tasks[e.node] += e.count
        assert tasks == {0: n // 2, 1: n // 2}  # every task went in a batch, spread evenly
        assert all(frames[node] <= n // 2 // 32 for node in (0, 1)), frames  # not a frame a task

        seen.clear()
        with pytest.raises(ValueError, match="thirty-seven"):
            sky.gather(*(loud_or_broken(i) for i in range(80))) >> pool
        assert any(isinstance(e, ev.TasksSent) for e in seen)
        # Each task's output is its own, under its own id.
        output = [e for e in seen if isinstance(e, ev.TaskOutput) and e.line.startswith("line of")]
        # (which tasks ran before the error cancelled the rest depends on the machine's speed)
        assert output and {e.line for e in output} <= {f"line of {i}" for i in range(80)}
        assert len({e.line for e in output}) == len({e.task_id for e in output}) == len(output)
        assert [list(r) for r in [sky.gather(square(3), square(4), stream=True) >> pool]] == [[9, 16]]


def test_a_node_lost_in_the_middle_of_a_batch_has_its_tasks_retried_on_the_other(tmp_path) -> None:
    marker = str(tmp_path / "died")
    seen: list[ev.Event] = []
    with sky.ComputePool(nodes=2, console=False, on_event=seen.append) as pool:
        n = 400
        results = sky.gather(*(square_or_die_once(i, marker) for i in range(n))) >> pool
        assert results == [i * i for i in range(n)]
        assert os.path.exists(marker)
        assert sum(1 for e in seen if isinstance(e, ev.TasksSent) and e.node == 1) <= n // 2 // 32
        retried = [e for e in seen if isinstance(e, ev.TaskRetried)]
        assert retried and all(e.lost_node == 1 for e in retried)
        lost = [e for e in seen if isinstance(e, ev.NodeStage) and e.stage == "lost"]
        assert [e.node for e in lost] == [1]


@sky.compute
def fail_at_once() -> None:
    raise KeyError("first")


@sky.compute
def touch_after(path: str, delay: float) -> None:
    import time

    time.sleep(delay)
    open(path, "w").close()


def test_a_failed_gather_cancels_the_rest_of_its_batch_on_the_worker(tmp_path) -> None:
    seen: list[ev.Event] = []
    with sky.ComputePool(nodes=1, console=False, on_event=seen.append) as pool:
        rest = [touch_after(str(tmp_path / f"t{i}"), 0.5) for i in range(40)]  # 20 s if all ran
        with pytest.raises(KeyError, match="first"):
            sky.gather(fail_at_once(), *rest) >> pool
        assert [e.count for e in seen if isinstance(e, ev.TasksSent)] == [41]
        # One slot: the worker runs its tasks in order, so any of the batch not cancelled would
        # have run before these.
        assert sky.gather(*(square(i) for i in range(100))) >> pool == [i * i for i in range(100)]
        assert len(list(tmp_path.iterdir())) <= 3
