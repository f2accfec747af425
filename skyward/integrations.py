"""Per-function framework setup: decorators placed under ``@sky.compute``.

``@sky.integrations.torch`` does, when the task is called on a worker, what the
``sky.plugins.torch()`` plugin does when the worker starts: export ``MASTER_ADDR``,
``RANK``, ``WORLD_SIZE``... and initialise ``torch.distributed``'s process group. Use it
when the pool has no torch plugin (e.g. a pool shared with non-torch work)::

    import skyward as sky

    @sky.compute
    @sky.integrations.torch                     # or @sky.integrations.torch(backend="gloo")
    def train() -> int:
        import torch.distributed as dist
        return dist.get_rank()

    with sky.ComputePool(nodes=2) as pool:
        train() @ pool                          # [0, 1]

Guarantees:

1. The group is initialised at most once per worker process, by the first decorated task
   that runs there; later calls find it and do nothing. With the torch plugin on the pool
   the group already exists, so the decorator does nothing at all.
2. On a single-node pool (and outside any pool) nothing is set or initialised.
3. The group lives as long as the worker process (the decorator does not destroy it after
   the task, so the next task can use it).

Because initialising is a collective step, the first decorated task must run on every node
at once: broadcast it with ``@``. Importing this module does not import torch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, overload

from skyward.compute import ComputeFunction
from skyward.errors import ConfigError
from skyward.plugins._torch import DEFAULT_TIMEOUT, Backend, check_backend, check_timeout, setup_process_group
from skyward.runtime import instance_info

__all__ = ["torch"]

P = ParamSpec("P")
R = TypeVar("R")


@overload
def torch(fn: Callable[P, R], /) -> Callable[P, R]: ...
@overload
def torch(
    fn: None = None, /, *, backend: Backend | None = None, timeout: float = DEFAULT_TIMEOUT
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...
def torch(fn: Any = None, /, *, backend: Backend | None = None, timeout: float = DEFAULT_TIMEOUT) -> Any:
    """Initialise ``torch.distributed`` for this node before the task runs (see the module doc).

    Args:
        backend: ``"nccl"``, ``"gloo"``, or None (nccl with CUDA, else gloo).
        timeout: seconds each rank waits for the others, at start and in every collective.

    Raises:
        ConfigError: for an invalid argument, or when placed above ``@sky.compute``, when the
            function is decorated.
    """
    if fn is not None and not callable(fn):
        raise ConfigError("integrations.torch", "a function, or keyword arguments backend=/timeout=", fn,
                          detail='write @sky.integrations.torch(backend="gloo")')
    backend = check_backend(backend)
    seconds = check_timeout(timeout)

    def decorate(func: Callable[P, R]) -> Callable[P, R]:
        if isinstance(func, ComputeFunction):  # it would run on the client, not on the workers
            raise ConfigError("integrations.torch", "to be placed below @sky.compute", func,
                              detail="@sky.compute must be the outermost decorator")
        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            setup_process_group(instance_info(), backend, seconds)
            return func(*args, **kwargs)

        return wrapper

    return decorate if fn is None else decorate(fn)
