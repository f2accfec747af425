"""The plugin pipeline: hooks nest in list order (first plugin outermost); failures name the plugin."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import skyward as sky

CLIENT_LOG: list[str] = []


def _record(path: str, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")


@contextlib.contextmanager
def _app(name: str, path: str, info: sky.InstanceInfo) -> Iterator[None]:
    _record(path, f"app-enter {name} node{info.node}")
    try:
        yield
    finally:
        _record(path, f"app-exit {name} node{info.node}")


def _task(name: str, path: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        _record(path, f"task-before {name}")
        try:
            return fn(*args, **kwargs)
        finally:
            _record(path, f"task-after {name}")

    return wrapped


def _transform(name: str, image: sky.Image, cluster: sky.PoolInfo) -> sky.Image:
    CLIENT_LOG.append(f"transform {name} nodes={cluster.nodes}")
    return image.with_env(ORDER=image.env.get("ORDER", "") + name)


@contextlib.contextmanager
def _client(name: str, pool: sky.ComputePool) -> Iterator[None]:
    CLIENT_LOG.append(f"client-enter {name}")
    try:
        yield
    finally:
        CLIENT_LOG.append(f"client-exit {name}")


def tracer(name: str, path: str) -> sky.Plugin:
    return sky.Plugin(
        name,
        transform=functools.partial(_transform, name),
        around_app=functools.partial(_app, name, path),
        around_task=functools.partial(_task, name, path),
        around_client=functools.partial(_client, name),
    )


@sky.compute
def read_order() -> str:
    return os.environ["ORDER"]


def test_hooks_nest_in_list_order_first_plugin_outermost(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = str(tmp_path / "log")
    CLIENT_LOG.clear()
    with sky.ComputePool(nodes=1, console=False, plugins=[tracer("a", path), tracer("b", path)]) as pool:
        assert read_order() >> pool == "ab"  # a's transform ran first, b saw its image
        assert CLIENT_LOG == ["transform a nodes=1", "transform b nodes=1", "client-enter a", "client-enter b"]
    assert CLIENT_LOG[-2:] == ["client-exit b", "client-exit a"]
    with open(path) as f:
        lines = f.read().split("\n")[:-1]
    assert lines == [
        "app-enter a node0", "app-enter b node0",
        "task-before a", "task-before b", "task-after b", "task-after a",
        "app-exit b node0", "app-exit a node0",
    ]


@contextlib.contextmanager
def _broken_app(info: sky.InstanceInfo) -> Iterator[None]:
    if info.node == 1:
        raise RuntimeError("no GPU driver here")
    yield


def _broken_transform(image: sky.Image, cluster: sky.PoolInfo) -> sky.Image:
    raise KeyError("missing setting")


def test_a_failing_around_app_names_the_plugin_and_the_node() -> None:
    with pytest.raises(sky.PluginError) as info:
        with sky.ComputePool(nodes=2, console=False, plugins=[sky.Plugin("drivers", around_app=_broken_app)]):
            pass
    err = info.value
    assert (err.plugin, err.node, err.hook) == ("drivers", 1, "around_app")
    assert "no GPU driver here" in str(err) and "_broken_app" in err.traceback


def test_a_failing_transform_names_the_plugin() -> None:
    with pytest.raises(sky.PluginError) as info:
        with sky.ComputePool(nodes=1, console=False, plugins=[sky.Plugin("settings", transform=_broken_transform)]):
            pass
    assert (info.value.plugin, info.value.node, info.value.hook) == ("settings", None, "transform")
    assert "on the client" in str(info.value)


def test_plugin_rejects_hooks_that_are_not_callable() -> None:
    with pytest.raises(sky.ConfigError) as info:
        sky.Plugin("x", around_task="nope")  # type: ignore[arg-type]
    assert info.value.parameter == "Plugin.around_task"
