"""The pydantic model of :class:`~skyward.ComputePool`'s options (see :mod:`skyward.pool.options`,
which builds them without it when every value is plainly valid: pydantic costs ~0.15 s to import)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, Field, InstanceOf

from skyward._config import STRICT, Count, Flag, Seconds, reject
from skyward.accelerators import Accelerator, parse_accelerator
from skyward.image import Image
from skyward.plugins._base import Plugin
from skyward.providers.base import Provider

__all__ = ["NODES", "PoolFields"]


def _provider(value: Any) -> Any:
    if value is None:
        from skyward.providers.local import Local

        return Local()
    return value


def _plugins(value: Any) -> Any:
    if isinstance(value, Plugin):
        reject("a list of sky.Plugin values", value, detail="pass even one plugin in a list: plugins=[plugin]")
    if not isinstance(value, (list, tuple)):
        reject("a list of sky.Plugin values", value)
    return tuple(value)


NODES = "an integer >= 1, or (min, max) with 1 <= min <= max for an elastic pool"


def _nodes(value: Any) -> Any:
    def count(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 1

    if count(value):
        return value
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(count(v) for v in value) and value[0] <= value[1]:
        return (value[0], value[1])
    reject(NODES, value)


def _plugin(value: Any) -> Plugin:
    if not isinstance(value, Plugin):
        reject("a sky.Plugin, e.g. sky.plugins.torch()", value)
    return value


class PoolFields(BaseModel):
    """Every option of a pool, checked and with its defaults filled in (as :class:`~skyward.pool.options.PoolOptions`)."""

    model_config = STRICT

    provider: Annotated[InstanceOf[Provider], BeforeValidator(_provider),
                        Field(description="a provider such as sky.Local(), sky.SSH(...) or sky.AWS(...)")]
    nodes: Annotated[int | tuple[int, int], BeforeValidator(_nodes), Field(description=NODES)] = 1
    scale_up_after: Seconds = 5.0
    scale_down_after: Seconds = 60.0
    replace_lost: Annotated[bool | None, Field(description="True, False or None (True for a (min, max) pool)")] = None
    concurrency: Count = 1
    executor: Annotated[Literal["thread", "process"], Field(description="'thread' or 'process'")] = "thread"
    idle_timeout: Seconds = 30.0
    heartbeat_interval: Seconds = 1.0
    start_timeout: Seconds = 120.0
    start_parallelism: Count = 32
    console: Flag = True
    dashboard: Flag = False
    on_event: Annotated[Callable[..., Any] | None,
                        Field(description="a function taking one skyward event, or None")] = None
    plugins: Annotated[tuple[Annotated[Any, AfterValidator(_plugin)], ...], BeforeValidator(_plugins),
                       Field(description="a list of sky.Plugin values")] = ()
    image: Annotated[InstanceOf[Image], BeforeValidator(lambda v: Image() if v is None else v),
                     Field(description="a sky.Image(...)")]
    accelerator: Annotated[InstanceOf[Accelerator] | None, BeforeValidator(parse_accelerator),
                           Field(description='an accelerator such as "A100" or "H100:8", or None')] = None
    processes_per_node: Annotated[Count | None,
                                  Field(description="an integer >= 1, or None (one per GPU with the torch "
                                                    "plugin on GPU nodes, else 1)")] = None
