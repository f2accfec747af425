"""``sky.plugins.jax``: install JAX on every node and join the workers with ``jax.distributed``.

Two hooks:

* ``transform`` (client): appends ``jax[cuda12]`` to the image's pip packages when the pool's
  accelerator runs CUDA (or when asked with ``cuda=True``), plain ``jax`` (the CPU build)
  otherwise. What the image and earlier plugins already had is kept, in order.
* ``around_app`` (worker, once per worker process): on a pool of two or more nodes, exports
  ``JAX_COORDINATOR_ADDRESS`` (node 0's address and ``head_port + port_offset``),
  ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID`` and ``JAX_LOCAL_DEVICE_COUNT``, calls
  ``jax.distributed.initialize`` with the same values and, when the worker stops, calls
  ``jax.distributed.shutdown``. A single-node pool sets nothing and initialises nothing.

The coordinator listens on ``head_port + port_offset`` (default ``head_port + 1``) so that it
never collides with torch.distributed, which the torch plugin puts on ``head_port`` itself:
``plugins=[sky.plugins.torch(), sky.plugins.jax()]`` is allowed.

jax is imported inside the worker-side hook only: importing this module never imports jax.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from skyward.errors import ConfigError
from skyward.plugins._base import PoolInfo, Plugin

if TYPE_CHECKING:
    from skyward.image import Image
    from skyward.runtime import InstanceInfo

__all__ = ["DEFAULT_PORT_OFFSET", "DEFAULT_TIMEOUT", "distributed_env", "exported_env", "jax", "requirement"]

#: The coordinator listens on ``head_port + DEFAULT_PORT_OFFSET`` (torch uses ``head_port``).
DEFAULT_PORT_OFFSET = 1
#: Seconds each process waits for the others in ``jax.distributed.initialize``.
DEFAULT_TIMEOUT = 300

_CPU = "jax"
_CUDA = "jax[cuda12]"


# -- shared helper (also used by the keras and huggingface plugins) -------------------------------


@contextlib.contextmanager
def exported_env(values: Mapping[str, str]) -> Iterator[None]:
    """Set ``values`` in ``os.environ`` for the duration of the block, then put back what was there."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


# -- client side ----------------------------------------------------------------------------------


def requirement(cuda: bool) -> str:
    """The pip requirement for JAX: ``"jax[cuda12]"`` with CUDA, ``"jax"`` (CPU) without.

    >>> requirement(True), requirement(False)
    ('jax[cuda12]', 'jax')
    """
    return _CUDA if cuda else _CPU


def _transform(image: Image, cluster: PoolInfo, *, cuda: bool | None) -> Image:
    use_cuda = cluster.cuda if cuda is None else cuda
    return image.with_pip(requirement(use_cuda))


# -- worker side ----------------------------------------------------------------------------------


def distributed_env(info: InstanceInfo, port_offset: int = DEFAULT_PORT_OFFSET) -> dict[str, str]:
    """The ``JAX_*`` variables for this node of the pool (one JAX process per node).

    ``JAX_PROCESS_ID`` is the node number, ``JAX_NUM_PROCESSES`` the number of nodes,
    ``JAX_LOCAL_DEVICE_COUNT`` the node's accelerators (1 when it has none: the CPU device).
    """
    return {
        "JAX_COORDINATOR_ADDRESS": f"{info.head_addr}:{info.head_port + port_offset}",
        "JAX_NUM_PROCESSES": str(info.total_nodes),
        "JAX_PROCESS_ID": str(info.node),
        "JAX_LOCAL_DEVICE_COUNT": str(info.accelerators or 1),
    }


@contextlib.contextmanager
def _distributed(info: InstanceInfo, *, port_offset: int, timeout: int, initialize: bool) -> Iterator[None]:
    if info.total_nodes < 2:
        yield
        return
    env = distributed_env(info, port_offset)
    with exported_env(env):
        if not initialize:
            yield
            return
        try:
            import jax
        except ImportError as exc:
            raise ImportError(
                "sky.plugins.jax() needs jax on every node: the plugin adds it to the image, but a "
                "provider that reuses this machine's environment (Local) expects it installed here "
                f"already ({exc})"
            ) from exc
        jax.distributed.initialize(
            coordinator_address=env["JAX_COORDINATOR_ADDRESS"],
            num_processes=info.total_nodes,
            process_id=info.node,
            initialization_timeout=timeout,
        )
        try:
            yield
        finally:
            jax.distributed.shutdown()


# -- the factory ----------------------------------------------------------------------------------


def jax(
    cuda: bool | None = None,
    *,
    port_offset: int = DEFAULT_PORT_OFFSET,
    timeout: int = DEFAULT_TIMEOUT,
    initialize: bool = True,
) -> Plugin:
    """JAX on every node, and ``jax.distributed`` initialised across the nodes of the pool.

    Args:
        cuda: install ``jax[cuda12]`` (True) or the CPU build ``jax`` (False); None follows
            the pool: CUDA wheels when its accelerator runs CUDA.
        port_offset: the coordinator (on node 0) listens on ``head_port + port_offset``;
            the default 1 keeps it off torch.distributed's ``head_port``.
        timeout: seconds each process waits for the others to join at start.
        initialize: False exports the ``JAX_*`` variables but leaves the call to
            ``jax.distributed.initialize`` to your code (for options the plugin does not set).

    Raises:
        ConfigError: for any invalid argument, when the plugin is made.

    >>> import skyward as sky
    >>> with sky.ComputePool(nodes=2, plugins=[sky.plugins.jax()]) as pool:  # doctest: +SKIP
    ...     counts = process_count() @ pool   # a task returning jax.process_count() -> [2, 2]
    """
    if cuda is not None and not isinstance(cuda, bool):
        raise ConfigError("cuda", "True, False, or None (follow the pool's accelerator)", cuda)
    if isinstance(port_offset, bool) or not isinstance(port_offset, int) or not 1 <= port_offset <= 1000:
        raise ConfigError("port_offset", "an integer from 1 to 1000", port_offset,
                          detail="0 would share torch.distributed's port")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 1:
        raise ConfigError("timeout", "a number of seconds >= 1", timeout)
    if not isinstance(initialize, bool):
        raise ConfigError("initialize", "True or False", initialize)
    return Plugin(
        "jax",
        transform=functools.partial(_transform, cuda=cuda),
        around_app=functools.partial(
            _distributed, port_offset=port_offset, timeout=int(timeout), initialize=initialize
        ),
    )
