"""Checked by mypy in tests/test_typing.py: result types survive the operators."""

from __future__ import annotations

from concurrent.futures import Future
from typing import assert_type

import skyward as sky


@sky.compute
def loss(lr: float, steps: int = 10) -> float:
    return lr * steps


@sky.compute(timeout=5)
def name(n: int) -> str:
    return str(n)


def check(pool: sky.ComputePool) -> None:
    pending = loss(0.1, steps=3)
    assert_type(pending, sky.PendingCompute[float])
    assert_type(pending >> pool, float)
    assert_type(pending @ pool, list[float])
    assert_type(pending > pool, Future[float])
    assert_type(pool.run(name(1)), str)
    assert_type(pool.submit(name(1)), Future[str])
    assert_type(pool.broadcast(name(1)), list[str])
    assert_type(loss.local(0.5), float)
    assert_type(name.local(3), str)
    assert_type(pool.map(name, [1, 2]), list[str])
    command = sky.shell("hostname")
    assert_type(command, sky.PendingCompute[sky.CommandResult])
    assert_type(command @ pool, list[sky.CommandResult])
    assert_type(command >> pool, sky.CommandResult)
    assert_type(pool.spawn(loss(0.1)).result(), float)
    assert_type(pool.spawn(loss(0.1), broadcast=True).result(timeout=5), list[float])
