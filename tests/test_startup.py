"""Starting a pool: workers are kept alive through slow start-up hooks, and a node whose
``around_app`` fails is reported at once, by name, with the pool torn down."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import pytest

import skyward as sky
from tests.conftest import skyward_workers, wait_gone


@contextlib.contextmanager
def _slow_app(info: sky.InstanceInfo) -> Iterator[None]:
    time.sleep(2.5)  # longer than the pool's idle_timeout below
    yield


@contextlib.contextmanager
def _fails_on_node_1(info: sky.InstanceInfo) -> Iterator[None]:
    if info.node == 1:
        raise RuntimeError("no driver on this node")
    time.sleep(60)  # node 0 waits for node 1, as a rendezvous would
    yield


@sky.compute
def node_number() -> int:
    return sky.instance_info().node


def test_an_around_app_slower_than_idle_timeout_does_not_kill_the_start() -> None:
    plugin = sky.Plugin("slow-download", around_app=_slow_app)
    with sky.ComputePool(nodes=2, console=False, plugins=[plugin], idle_timeout=1.0,
                         heartbeat_interval=0.2) as pool:
        assert node_number() @ pool == [0, 1]


def test_a_failing_around_app_on_one_node_is_reported_at_once_and_the_pool_torn_down() -> None:
    before = set(skyward_workers())
    plugin = sky.Plugin("drivers", around_app=_fails_on_node_1)
    started = time.monotonic()
    with pytest.raises(sky.PluginError) as info:
        with sky.ComputePool(nodes=2, console=False, plugins=[plugin]):
            pass
    elapsed = time.monotonic() - started
    err = info.value
    assert (err.plugin, err.node, err.hook) == ("drivers", 1, "around_app")
    assert "no driver on this node" in str(err) and "_fails_on_node_1" in err.traceback
    assert elapsed < 5.0, f"reported after {elapsed:.1f}s"
    assert wait_gone([p for p in skyward_workers() if p not in before], 5.0) == []
