"""The reply path's polling window, ``SKYWARD_SPIN_US`` (docs/pool.md), through the public API.

Who reads a worker's replies must never change what a caller gets back: the behaviours of
the reply path (blocking calls interleaved with futures, callers on many threads, output
during a blocking call, Ctrl-C mid-reply, a timeout, a worker dying or its stream breaking
under a blocking call) are in the contract suite, ``tests/contract/``, run on Local and SSH.
"""

from __future__ import annotations

import time

import pytest

import skyward as sky


@sky.compute
def echo(x: object) -> object:
    return x


@sky.compute
def nap(seconds: float, x: object = None) -> object:
    time.sleep(seconds)
    return x


@pytest.mark.parametrize("value", ["0", "50", "2000"])
def test_any_spin_window_or_none_gives_every_caller_its_own_results(monkeypatch, value) -> None:
    monkeypatch.setenv("SKYWARD_SPIN_US", value)
    with sky.ComputePool(nodes=1, console=False) as pool:
        assert [echo(i) >> pool for i in range(50)] == list(range(50))
        assert nap(0.2, "slow") >> pool == "slow"  # longer than any spin: blocks, then wakes
        futures = [nap(0.01, i) > pool for i in range(5)]
        assert [echo(i) >> pool for i in range(5)] == list(range(5))
        assert [f.result(10) for f in futures] == list(range(5))


@pytest.mark.parametrize("value", ["-1", "fast", "1.5"])
def test_a_bad_spin_window_is_a_config_error_naming_the_variable(monkeypatch, value) -> None:
    monkeypatch.setenv("SKYWARD_SPIN_US", value)
    with pytest.raises(sky.ConfigError, match="SKYWARD_SPIN_US"):
        sky.ComputePool(nodes=1, console=False)
