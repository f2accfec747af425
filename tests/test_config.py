"""Bad input raises ConfigError naming the parameter and what is accepted, before any worker starts."""

from __future__ import annotations

import pytest

import skyward as sky
from skyward import events as ev
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
        ({"idle_timeout": float("inf")}, "idle_timeout", "not inf or nan"),
        ({"start_timeout": float("nan")}, "start_timeout", "not inf or nan"),
        ({"heartbeat_interval": True}, "heartbeat_interval", "positive number"),
        ({"on_event": "print"}, "on_event", "a function"),
        ({"plugins": "torch"}, "plugins", "a list of sky.Plugin"),
        ({"plugins": [sky.Plugin("ok"), "torch"]}, "plugins[1]", "sky.Plugin"),
        ({"accelerator": "Z9000"}, "accelerator", "A100"),
    ],
)
def test_bad_pool_arguments(kwargs: dict, parameter: str, accepted: str) -> None:
    before = set(skyward_workers())
    with pytest.raises(sky.ConfigError) as info:
        sky.ComputePool(console=False, **kwargs)
    assert info.value.parameter == parameter
    assert accepted in str(info.value)
    assert set(skyward_workers()) == before  # nothing was started


def test_console_must_be_a_bool() -> None:
    with pytest.raises(sky.ConfigError) as info:
        sky.ComputePool(console="no")  # type: ignore[arg-type]
    assert info.value.parameter == "console"
    assert "True or False" in str(info.value)


def test_a_single_plugin_passed_bare_is_told_to_use_a_list() -> None:
    with pytest.raises(sky.ConfigError) as info:
        sky.ComputePool(console=False, plugins=sky.Plugin("alone"))  # type: ignore[arg-type]
    assert info.value.parameter == "plugins"
    assert "in a list" in str(info.value)


def test_validation_errors_are_config_errors_without_pydantic_in_the_chain() -> None:
    with pytest.raises(sky.ConfigError) as info:
        sky.ComputePool(console=False, nodes="2")  # type: ignore[arg-type]
    assert info.value.got == "2"
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_pool_options_fill_in_defaults_and_keep_values() -> None:
    seen: list[ev.Event] = []
    pool = sky.ComputePool(nodes=2, concurrency=3, idle_timeout=5, console=False,
                           on_event=seen.append, plugins=[sky.Plugin("p")])
    assert (pool.nodes, pool.concurrency, pool.idle_timeout) == (2, 3, 5.0)
    assert isinstance(pool.provider, sky.Local) and pool.image == sky.Image() and pool.accelerator is None
    rented = sky.ComputePool(provider=sky.SSH(["10.0.0.1", "10.0.0.2"]), nodes=2, accelerator="A100:2", console=False)
    assert rented.accelerator is not None and rented.accelerator.count == 2
    assert rented.spec.accelerator == rented.accelerator
    assert [p.name for p in pool.plugins] == ["p"]
    with pool:  # on_event is kept: it hears the pool start
        pass
    assert [type(e) for e in seen if isinstance(e, (ev.PoolReady, ev.PoolStopped))] == [ev.PoolReady, ev.PoolStopped]


def test_importing_skyward_or_its_worker_does_not_import_pydantic() -> None:
    import subprocess
    import sys

    code = "import sys, skyward, skyward.worker, skyward.image; print('pydantic' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


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


def test_processes_per_node_defaults_to_one_per_gpu_with_the_torch_plugin_only() -> None:
    torch_plugin = sky.plugins.torch()

    def processes(**options: object) -> int:
        # An SSH pool is only described here: nothing connects before the pool is entered.
        return sky.ComputePool(provider=sky.SSH(["192.0.2.1"]), console=False, **options).processes_per_node  # type: ignore[arg-type]

    assert processes(accelerator="A100:4", plugins=[torch_plugin]) == 4
    assert processes(accelerator="A100:4") == 1  # no torch plugin: one per node
    assert processes(plugins=[torch_plugin]) == 1  # no GPUs
    assert processes(accelerator="A100:4", plugins=[torch_plugin], processes_per_node=2) == 2


@pytest.mark.parametrize("value", [0, -1, 1.5, "2", True])
def test_processes_per_node_must_be_a_positive_integer(value) -> None:
    with pytest.raises(sky.ConfigError) as info:
        sky.ComputePool(processes_per_node=value, console=False)
    assert info.value.parameter == "processes_per_node"
