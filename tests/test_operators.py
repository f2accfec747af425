"""Every operator and method form, with result ordering, on real Local worker processes."""

from __future__ import annotations

import collections
import os
import pickle
import time
from concurrent.futures import Future

import pytest

import skyward as sky


@sky.compute
def add(a: int, b: int) -> int:
    return a + b


@sky.compute
def node_of(delay: float = 0.0) -> int:
    time.sleep(delay)
    return sky.instance_info().node


@sky.compute
def echo_after(value: object, delay: float) -> object:
    time.sleep(delay)
    return value


def test_compute_call_is_lazy_and_local_runs_here() -> None:
    calls = []

    @sky.compute
    def record(x: int) -> int:
        calls.append(x)
        return x * 2

    pending = record(21)
    assert isinstance(pending, sky.PendingCompute)
    assert calls == []
    assert record.local(21) == 42
    assert pending.local() == 42
    assert calls == [21, 21]


def test_pending_compute_is_frozen_and_picklable() -> None:
    pending = add(2, 3)
    with pytest.raises(AttributeError):
        pending.args = (9, 9)  # type: ignore[misc]
    clone = pickle.loads(pickle.dumps(pending))
    assert clone.local() == 5
    assert clone.name == "add"


def test_compute_options_name_and_timeout() -> None:
    @sky.compute(name="renamed", timeout=2.5)
    def f() -> None: ...

    assert f().options.name == "renamed"
    assert f().options.timeout == 2.5


def test_rshift_runs_on_one_node(pool2: sky.ComputePool) -> None:
    assert add(2, 3) >> pool2 == 5
    assert pool2.run(add(4, 4)) == 8


def test_rshift_picks_the_least_busy_node(pool2: sky.ComputePool) -> None:
    busy = node_of(1.5) > pool2
    time.sleep(0.2)
    others = [node_of() >> pool2 for _ in range(3)]  # each must avoid the busy node
    assert not busy.done()
    assert set(others) == {1 - busy.result()}


def test_matmul_broadcasts_to_every_node_ordered_by_node(pool2: sky.ComputePool) -> None:
    assert node_of() @ pool2 == [0, 1]
    assert pool2.broadcast(add(1, 1)) == [2, 2]


def test_and_gives_a_tuple_in_input_order(pool2: sky.ComputePool) -> None:
    result = (echo_after("slow", 0.4) & echo_after("fast", 0.0) & add(1, 2)) >> pool2
    assert result == ("slow", "fast", 3)


def test_gather_gives_a_list_in_input_order(pool2: sky.ComputePool) -> None:
    delays = [0.3, 0.0, 0.2, 0.1]
    assert sky.gather(*(echo_after(i, d) for i, d in enumerate(delays))) >> pool2 == [0, 1, 2, 3]
    assert pool2.gather(add(1, 1), add(2, 2)) == [2, 4]


def test_gather_uses_every_node(pool2: sky.ComputePool) -> None:
    nodes = sky.gather(*(node_of(0.2) for _ in range(4))) >> pool2
    assert sorted(nodes) == [0, 0, 1, 1]


@sky.compute
def node_once_there(path: str) -> int:
    """The node it ran on, once ``path`` exists (a task that stays in flight until then)."""
    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    return sky.instance_info().node


def test_gather_sends_each_task_to_the_least_busy_node_round_robin_among_equals(tmp_path) -> None:
    go = str(tmp_path / "go")
    with sky.ComputePool(nodes=4, console=False) as pool:
        try:
            held = [node_once_there(go) > pool for _ in range(3)]  # three nodes with one task each
            stream = sky.gather(*(node_once_there(go) for _ in range(5)), stream=True) >> pool
        finally:
            open(go, "w").close()
        busy = {f.result() for f in held}
        idle = ({0, 1, 2, 3} - busy).pop()
        # The idle node first; then all four have one in flight: one each.
        assert collections.Counter(stream) == {idle: 2, **{n: 1 for n in busy}}


def test_streaming_gather_unordered_yields_in_completion_order(pool2: sky.ComputePool) -> None:
    stream = sky.gather(echo_after("slow", 0.8), echo_after("fast", 0.0), stream=True, ordered=False) >> pool2
    assert not isinstance(stream, list)
    assert list(stream) == ["fast", "slow"]


def test_streaming_gather_ordered_yields_in_input_order(pool2: sky.ComputePool) -> None:
    stream = pool2.gather(echo_after("slow", 0.5), echo_after("fast", 0.0), stream=True, ordered=True)
    first = next(stream)
    assert first == "slow"
    assert list(stream) == ["fast"]


def test_gt_submits_and_returns_a_future(pool2: sky.ComputePool) -> None:
    future = echo_after("later", 0.3) > pool2
    assert isinstance(future, Future)
    assert not future.done()
    assert future.result(timeout=10) == "later"
    assert pool2.submit(add(1, 2)).result(timeout=10) == 3


def test_map_runs_each_item_in_order(pool2: sky.ComputePool) -> None:
    assert pool2.map(_double, range(6)) == [0, 2, 4, 6, 8, 10]
    assert pool2.map(double, [3, 4]) == [6, 8]


def _double(x: int) -> int:
    return 2 * x


@sky.compute
def double(x: int) -> int:
    return 2 * x


class CountingArg:
    """Counts how many times the client pickles it."""

    pickled = 0

    def __reduce__(self):  # type: ignore[override]
        CountingArg.pickled += 1
        return (CountingArg, ())


@sky.compute
def takes(arg: object) -> str:
    return type(arg).__name__


def test_broadcast_serializes_the_task_once() -> None:
    CountingArg.pickled = 0
    with sky.ComputePool(nodes=3, console=False) as pool:
        assert takes(CountingArg()) @ pool == ["CountingArg"] * 3
    assert CountingArg.pickled == 1


def test_large_numpy_array_round_trips_unchanged(pool2: sky.ComputePool) -> None:
    np = pytest.importorskip("numpy")
    data = np.random.default_rng(0).standard_normal(4 * 1024 * 1024)  # 32 MiB
    back = echo_after(data, 0.0) >> pool2
    assert back.dtype == data.dtype
    assert np.array_equal(back, data)


def test_tasks_run_concurrently_in_slots() -> None:
    with sky.ComputePool(nodes=1, concurrency=3, console=False) as pool:
        started = time.monotonic()
        assert sky.gather(*(echo_after(i, 0.5) for i in range(3))) >> pool == [0, 1, 2]
        assert time.monotonic() - started < 1.4  # three 0.5 s sleeps overlapped


def test_process_executor_runs_tasks_in_child_processes() -> None:
    @sky.compute
    def pids() -> tuple[int, int]:
        import os

        return os.getpid(), os.getppid()

    with sky.ComputePool(nodes=1, concurrency=2, executor="process", console=False) as pool:
        worker = pool.worker_pids()[0]
        pid, parent = pids() >> pool
        assert parent == worker and pid != worker
        assert sky.gather(*(echo_after(i, 0.3) for i in range(4))) >> pool == [0, 1, 2, 3]
