"""ComputePool's options: plainly valid values are taken without loading pydantic (what
``skyward exec NAME`` spends before connecting), with the same result as pydantic's checks;
anything else is still judged by pydantic, with its errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

import skyward as sky
from skyward.errors import ConfigError
from skyward.pool.option_fields import PoolFields
from skyward.pool.options import PoolOptions, pool_options


def test_a_plain_pool_and_image_load_no_pydantic() -> None:
    code = ("import sys, skyward as sky\n"
            "pool = sky.ComputePool(nodes=2, console=False, idle_timeout=5.0)\n"
            "image = sky.Image()\n"
            "print(pool.min_nodes, pool.idle_timeout, image.env == {}, 'pydantic' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["2", "5.0", "True", "False"]


def test_plain_values_give_what_pydantic_gives() -> None:
    given = {"provider": sky.Local(), "nodes": 3, "concurrency": 2, "idle_timeout": 4.0, "console": False,
             "image": sky.Image(), "plugins": [], "processes_per_node": 2}
    checked = PoolFields(**given)
    plain = pool_options(**given)
    for name in PoolOptions.__dataclass_fields__:
        assert getattr(plain, name) == getattr(checked, name), name


@pytest.mark.parametrize(("given", "parameter"), [({"nodes": 0}, "nodes"), ({"concurrency": True}, "concurrency"),
                                                  ({"idle_timeout": float("inf")}, "idle_timeout"),
                                                  ({"executor": "fork"}, "executor"), ({"nodez": 2}, "nodez")])
def test_what_is_not_plainly_valid_is_still_refused_naming_the_parameter(given: dict, parameter: str) -> None:
    with pytest.raises(ConfigError) as refused:
        pool_options(**given)
    assert parameter in str(refused.value)


def test_values_only_pydantic_takes_are_still_taken() -> None:
    options = pool_options(nodes=(1, 3), idle_timeout=5, accelerator="A100:2")
    assert options.limits == (1, 3) and options.elastic and options.idle_timeout == 5
    assert options.accelerator is not None and options.accelerator.count == 2
