"""Every operator gives the same results, in the same order, on every provider."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import numpy as np

import skyward as sky
from tests.contract.tasks import echo, held


@sky.compute
def add(a: int, b: int) -> int:
    return a + b


@sky.compute
def square(x: int) -> int:
    return x * x


@sky.compute
def where() -> tuple[int, int, bool]:
    info = sky.instance_info()
    return info.node, info.total_nodes, info.is_head


@sky.compute
def touch(path: str, value: object) -> object:
    Path(path).touch()
    return value


@sky.compute
def slow_echo(seconds: float, value: object) -> object:
    time.sleep(seconds)
    return value


@sky.compute
def reversed_with_digest(data: bytes) -> tuple[bytes, str]:
    return data[::-1], hashlib.sha256(data).hexdigest()


@sky.compute
def doubled(array: np.ndarray) -> np.ndarray:
    return array * 2


def test_rshift_runs_on_one_node_and_returns_its_result(pool: sky.ComputePool) -> None:
    assert add(2, 3) >> pool == 5
    assert where() >> pool in [(0, 2, True), (1, 2, False)]


def test_matmul_gives_one_result_per_node_ordered_by_node(pool: sky.ComputePool) -> None:
    assert where() @ pool == [(0, 2, True), (1, 2, False)]
    assert add(1, 2) @ pool == [3, 3]


def test_and_runs_its_calls_concurrently_and_gives_a_tuple_in_input_order(pool: sky.ComputePool, tmp_path) -> None:
    flag = str(tmp_path / "flag")
    # The first call holds until the second has run: only concurrent calls can both finish.
    assert (held(flag, "first") & touch(flag, "second") & square(3)) >> pool == ("first", "second", 9)


def test_gather_gives_a_list_in_input_order(pool: sky.ComputePool) -> None:
    results = sky.gather(*(slow_echo(0.05 * (5 - i), i) for i in range(6))) >> pool
    assert results == [0, 1, 2, 3, 4, 5]


def test_streaming_unordered_gather_yields_results_as_they_finish(pool: sky.ComputePool, tmp_path) -> None:
    release = tmp_path / "release"
    stream = sky.gather(held(str(release), "slow"), square(3), stream=True, ordered=False) >> pool
    assert next(stream) == 9  # while the first call is still held
    release.touch()
    assert list(stream) == ["slow"]


def test_gt_returns_a_future_without_waiting(pool: sky.ComputePool, tmp_path) -> None:
    release = tmp_path / "release"
    future = held(str(release), 42) > pool
    assert isinstance(future, Future)
    assert not future.done()
    release.touch()
    assert future.result(timeout=30) == 42


def test_map_gives_every_result_in_input_order(pool: sky.ComputePool) -> None:
    assert pool.map(square, range(8)) == [0, 1, 4, 9, 16, 25, 36, 49]


def test_blocking_calls_interleaved_with_futures_each_get_their_own_result(pool: sky.ComputePool) -> None:
    for round_ in range(3):
        futures = [slow_echo(0.05, (round_, "future", i)) > pool for i in range(3)]
        assert [echo((round_, i)) >> pool for i in range(5)] == [(round_, i) for i in range(5)]
        assert [f.result(timeout=30) for f in futures] == [(round_, "future", i) for i in range(3)]
        assert [echo(i) >> pool for i in range(20)] == list(range(20))
        assert (echo("late") > pool).result(timeout=30) == "late"


def test_callers_on_many_threads_each_get_their_own_results(pool: sky.ComputePool) -> None:
    results: dict[int, list[object]] = {}

    def caller(k: int) -> None:
        results[k] = [echo((k, i)) >> pool for i in range(50)]

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {k: [(k, i) for i in range(50)] for k in range(4)}


def test_megabytes_of_bytes_round_trip_unchanged(pool: sky.ComputePool) -> None:
    data = os.urandom(8 << 20)
    back, digest = reversed_with_digest(data) >> pool
    assert digest == hashlib.sha256(data).hexdigest()
    assert back == data[::-1]


def test_a_large_numpy_array_round_trips_unchanged(pool: sky.ComputePool) -> None:
    array = np.random.default_rng(0).standard_normal((1024, 1024))  # 8 MiB of float64
    results = doubled(array) @ pool
    assert len(results) == 2
    for result in results:
        assert result.dtype == np.float64 and result.shape == (1024, 1024)
        assert np.array_equal(result, array * 2)

