"""The options of :class:`~skyward.ComputePool`, validated once, before anything starts.

``ComputePool.__init__`` hands its arguments to :func:`pool_options` and keeps the frozen
:class:`PoolOptions` it gets back (defaults filled in: ``provider=None`` is ``sky.Local()``,
``image=None`` is ``sky.Image()``, an accelerator string is parsed). Any bad value raises
:class:`~skyward.errors.ConfigError` naming the parameter, what is accepted, and the value.

The checks are pydantic's (:mod:`skyward.pool.option_fields`, see :mod:`skyward._config`),
loaded only for values that are not plainly valid: pydantic costs ~0.15 s to import, most of
what ``ComputePool(name=...)`` in a fresh process (``skyward exec NAME``) would spend before
connecting. The plain check accepts a subset of what pydantic accepts, with the same result,
and hands anything else (every error included) to pydantic.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, Literal

from skyward.accelerators import Accelerator
from skyward.image import Image
from skyward.plugins._base import Plugin
from skyward.providers.base import Provider

__all__ = ["PoolOptions", "pool_options"]


@dataclass(frozen=True)
class PoolOptions:
    """Every option of a pool, checked and with its defaults filled in."""

    provider: Provider
    image: Image
    nodes: int | tuple[int, int] = 1
    scale_up_after: float = 5.0
    scale_down_after: float = 60.0
    replace_lost: bool | None = None
    concurrency: int = 1
    executor: Literal["thread", "process"] = "thread"
    idle_timeout: float = 30.0
    heartbeat_interval: float = 1.0
    start_timeout: float = 120.0
    start_parallelism: int = 32
    console: bool = True
    dashboard: bool = False
    on_event: Callable[..., Any] | None = None
    plugins: tuple[Plugin, ...] = ()
    accelerator: Accelerator | None = None
    processes_per_node: int | None = None

    @property
    def elastic(self) -> bool:
        """``nodes`` was given as ``(min, max)``."""
        return isinstance(self.nodes, tuple)

    @property
    def limits(self) -> tuple[int, int]:
        """(min, max) nodes: both the count for a fixed pool."""
        return self.nodes if isinstance(self.nodes, tuple) else (self.nodes, self.nodes)

    @property
    def replacing(self) -> bool:
        """Whether a lost node is replaced (``replace_lost``; None means: for an elastic pool)."""
        return self.elastic if self.replace_lost is None else self.replace_lost

    @property
    def processes(self) -> int:
        """Worker processes per node: as given, else one per GPU for the torch plugin on CUDA
        nodes (as ``torchrun --nproc_per_node`` is used), else one."""
        if self.processes_per_node is not None:
            return self.processes_per_node
        acc = self.accelerator
        if acc is not None and acc.cuda and acc.count > 1 and any(p.name == "torch" for p in self.plugins):
            return acc.count
        return 1



_SECONDS = ("scale_up_after", "scale_down_after", "idle_timeout", "heartbeat_interval", "start_timeout")
_COUNTS = ("concurrency", "start_parallelism")


def _count(value: Any) -> bool:
    return type(value) is int and value >= 1


def _plain(values: dict[str, Any]) -> PoolOptions | None:
    """The options when every value is plainly valid (the common ones, in the types pydantic
    keeps as they are); None for anything else, which pydantic then judges."""
    if not set(values) <= {f.name for f in fields(PoolOptions)}:
        return None
    v = dict(values)
    checks = [v["provider"] is None or isinstance(v["provider"], Provider),
              v["image"] is None or isinstance(v["image"], Image),
              _count(v.get("nodes", 1)), v.get("replace_lost") in (None, True, False),
              v.get("executor", "thread") in ("thread", "process") and type(v.get("executor", "thread")) is str,
              *(type(v.get(k, False)) is bool for k in ("console", "dashboard")),
              *(_count(v.get(k, 1)) for k in _COUNTS),
              *(type(v.get(k, 1.0)) is float and 0 < v.get(k, 1.0) < math.inf for k in _SECONDS),
              v.get("on_event") is None or callable(v["on_event"]),
              type(v.get("plugins", ())) in (tuple, list) and not v.get("plugins", ()),
              v.get("accelerator") is None or isinstance(v["accelerator"], Accelerator),
              v.get("processes_per_node") is None or _count(v["processes_per_node"])]
    if not all(checks):
        return None
    if v["provider"] is None:
        from skyward.providers.local import Local

        v["provider"] = Local()
    v["image"] = Image() if v["image"] is None else v["image"]
    v["plugins"] = ()
    return PoolOptions(**v)


def pool_options(**values: Any) -> PoolOptions:
    """Validate ``ComputePool``'s keyword arguments; raises ConfigError for the first bad one."""
    values.setdefault("provider", None)
    values.setdefault("image", None)
    plain = _plain(values)
    if plain is not None:
        return plain
    from skyward._config import validate
    from skyward.pool.option_fields import PoolFields

    checked = validate(PoolFields, values)
    return PoolOptions(**{f.name: getattr(checked, f.name) for f in fields(PoolOptions)})
