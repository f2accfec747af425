"""Bad input raises ConfigError naming the parameter and what is accepted, before any worker starts."""

from __future__ import annotations

import pytest

import skyward as sky
from tests.conftest import skyward_workers


@sky.compute
def one() -> int:
    return 1


@pytest.mark.parametrize(
    ("kwargs", "parameter", "accepted"),
    [
        ({"nodes": 0}, "nodes", "integer >= 1"),
        ({"nodes": -3}, "nodes", "integer >= 1"),
        ({"nodes": "2"}, "nodes", "integer >= 1"),
        ({"nodes": True}, "nodes", "integer >= 1"),
        ({"concurrency": 0}, "concurrency", "integer >= 1"),
        ({"executor": "fork"}, "executor", "'thread' or 'process'"),
        ({"idle_timeout": 0}, "idle_timeout", "positive number"),
        ({"provider": "local"}, "provider", "sky.Local()"),
        ({"plugins": ["torch"]}, "plugins[0]", "sky.Plugin"),
        ({"image": {"pip": ["x"]}}, "image", "sky.Image"),
    ],
)
def test_bad_pool_arguments(kwargs: dict, parameter: str, accepted: str) -> None:
    before = set(skyward_workers())
    with pytest.raises(sky.ConfigError) as info:
        sky.ComputePool(console=False, **kwargs)
    assert info.value.parameter == parameter
    assert accepted in str(info.value)
    assert set(skyward_workers()) == before  # nothing was started


def test_dispatch_to_a_pool_never_entered() -> None:
    pool = sky.ComputePool(nodes=1, console=False)
    with pytest.raises(sky.ConfigError, match="never entered"):
        one() >> pool


def test_dispatch_to_a_closed_pool() -> None:
    with sky.ComputePool(nodes=1, console=False) as pool:
        assert one() >> pool == 1
    for op in (lambda: one() >> pool, lambda: one() @ pool, lambda: one() > pool, lambda: pool.map(one, [])):
        with pytest.raises(sky.ConfigError, match="closed"):
            op()


def test_a_pool_cannot_be_entered_twice() -> None:
    pool = sky.ComputePool(nodes=1, console=False)
    with pool:
        pass
    with pytest.raises(sky.ConfigError, match="entered once"):
        with pool:
            pass


def test_gather_rejects_values_that_are_not_pending() -> None:
    with pytest.raises(sky.ConfigError) as info:
        sky.gather(one(), 2)  # type: ignore[arg-type]
    assert info.value.parameter == "gather() argument 1"
    with pytest.raises(sky.ConfigError):
        one() & 3  # type: ignore[operator]


def test_operator_needs_a_pool_on_the_right() -> None:
    with pytest.raises(sky.ConfigError, match="ComputePool"):
        one() >> 3  # type: ignore[operator]


def test_compute_rejects_bad_options() -> None:
    with pytest.raises(sky.ConfigError) as info:
        sky.compute(timeout=-1)(lambda: None)
    assert info.value.parameter == "timeout"
    with pytest.raises(sky.ConfigError):
        sky.compute(name="")(lambda: None)


def test_output_control_rejects_bad_only() -> None:
    with pytest.raises(sky.ConfigError) as info:
        sky.stdout(only="tail")  # type: ignore[arg-type]
    assert info.value.parameter == "only"
