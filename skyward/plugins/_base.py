"""The plugin types: :class:`Plugin` (a value with optional hooks, applied by the pool on the
client and by the worker) and :class:`PoolInfo` (what ``transform`` is told about the pool).
Re-exported by :mod:`skyward.plugins` and as ``sky.Plugin`` / ``sky.PoolInfo``.

Hooks, all optional (an absent hook is a no-op):

* ``transform(image, cluster) -> image`` — client side, before machines are prepared.
* ``around_app(info)`` — a context manager entered once per worker process at start (after
  the worker knows its :class:`~skyward.InstanceInfo`) and exited when it stops.
* ``around_task(fn) -> fn`` — wraps every task function on the worker.
* ``around_client(pool)`` — a context manager on the client for the pool's lifetime.

Order: plugins nest in list order, the first plugin outermost. For ``plugins=[a, b]``:
``a.around_app`` is entered before ``b.around_app`` and exited after it; a task runs as
``a.around_task(b.around_task(fn))``; ``transform`` runs ``a`` then ``b``; ``around_client``
enters ``a`` then ``b``.

A plugin travels to the worker by pickling, so its hooks must be picklable (module-level
functions, or ``functools.partial`` of them, pickle by reference).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from skyward.errors import ConfigError

if TYPE_CHECKING:
    from skyward.image import Image
    from skyward.runtime import InstanceInfo

__all__ = ["PoolInfo", "Plugin"]


@dataclass(frozen=True, slots=True)
class PoolInfo:
    """What a plugin's ``transform`` knows about the pool being built.

    Attributes:
        nodes: how many nodes the pool asks for.
        accelerator: the parsed accelerator (``None`` for CPU pools); see :attr:`cuda`.
        provider: the provider's short name: ``"local"``, ``"ssh"`` or ``"aws"``.
        concurrency: task slots per node.
    """

    nodes: int
    accelerator: Any = None  # skyward.accelerators.Accelerator | None
    provider: str = "local"
    concurrency: int = 1
    processes_per_node: int = 1

    @property
    def cuda(self) -> bool:
        """True when the pool's accelerator is CUDA-capable."""
        return bool(getattr(self.accelerator, "cuda", False))


@dataclass(frozen=True, slots=True)
class Plugin:
    """A named bundle of hooks; every hook is optional (an absent one does nothing).

    Attributes:
        name: shown in messages and in a ``PluginError`` when a hook fails on a node.
        transform: ``(image, cluster) -> image``, on the client before machines are prepared
            (add pip packages, indexes, environment variables).
        around_app: ``(info) -> context manager``, entered once per worker process at start
            and exited when it stops (e.g. a distributed process group).
        around_task: ``(fn) -> fn``, wraps every task function on the worker.
        around_client: ``(pool) -> context manager``, on the client for the pool's lifetime.

    Plugins nest in list order (the first is outermost) and travel to the workers pickled, so
    hooks must be module-level functions or ``functools.partial`` of them.

    Example:
        >>> def add_numpy(image, cluster):
        ...     return image.with_pip("numpy")
        >>> plugin = sky.Plugin("numpy", transform=add_numpy)
    """

    name: str
    transform: Callable[[Image, PoolInfo], Image] | None = None
    around_app: Callable[[InstanceInfo], AbstractContextManager[Any]] | None = None
    around_task: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None
    around_client: Callable[[Any], AbstractContextManager[Any]] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError("Plugin.name", "a non-empty string", self.name)
        for hook in ("transform", "around_app", "around_task", "around_client"):
            value = getattr(self, hook)
            if value is not None and not callable(value):
                raise ConfigError(f"Plugin.{hook}", "a callable or None", value, detail=f"plugin {self.name!r}")


def wrap_task(plugins: tuple[Plugin, ...], fn: Callable[..., Any]) -> Callable[..., Any]:
    """Apply every ``around_task`` hook so that the first plugin is outermost."""
    for plugin in reversed(plugins):
        if plugin.around_task is not None:
            fn = plugin.around_task(fn)
    return fn
