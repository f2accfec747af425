"""``sky.plugins.keras``: install Keras 3 on every node and pin its backend before it is imported.

Keras reads ``KERAS_BACKEND`` once, when ``keras`` is first imported, so the variable must be
in the worker's environment before any task runs. Two hooks:

* ``transform`` (client): appends ``keras`` to the image's pip packages and sets
  ``KERAS_BACKEND`` in the image's env (so setup commands see it too). The backend framework
  itself is not added: ``sky.plugins.jax()`` / ``sky.plugins.torch()`` install JAX / PyTorch
  with the right CUDA wheels; for ``"tensorflow"`` add ``tensorflow`` to the image's pip.
* ``around_app`` (worker, once per worker process): sets ``os.environ["KERAS_BACKEND"]``
  before any task can import keras; if something already imported keras with another backend,
  says so on stderr (that import cannot be undone).

keras is never imported by this module, on the client or the worker.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Literal

from skyward.errors import ConfigError
from skyward.plugins._base import PoolInfo, Plugin
from skyward.plugins._jax import exported_env

if TYPE_CHECKING:
    from skyward.image import Image
    from skyward.runtime import InstanceInfo

__all__ = ["BACKENDS", "keras"]

Backend = Literal["jax", "torch", "tensorflow"]

#: The Keras 3 backends the plugin accepts.
BACKENDS: tuple[str, ...] = ("jax", "torch", "tensorflow")
ENV_VAR = "KERAS_BACKEND"


def _transform(image: Image, cluster: PoolInfo, *, backend: str) -> Image:
    return image.with_pip("keras").with_env({ENV_VAR: backend})


def _imported_backend() -> str | None:
    """The backend of an already imported keras, or None when keras is not imported (yet)."""
    module = sys.modules.get("keras")
    if module is None:
        return None
    try:
        return str(module.backend.backend())
    except Exception:  # a partial import, or not Keras 3: nothing reliable to compare
        return None


@contextlib.contextmanager
def _pin_backend(info: InstanceInfo, *, backend: str) -> Iterator[None]:
    current = _imported_backend()
    if current is not None and current != backend:
        print(
            f"skyward: sky.plugins.keras(backend={backend!r}): keras was already imported on node "
            f"{info.node} with backend {current!r}; KERAS_BACKEND only takes effect before the "
            "first import of keras",
            file=sys.stderr,
        )
    with exported_env({ENV_VAR: backend}):
        yield


def keras(backend: Backend = "jax") -> Plugin:
    """Keras 3 on every node, with ``KERAS_BACKEND`` set before keras is imported.

    Args:
        backend: ``"jax"``, ``"torch"`` or ``"tensorflow"``. Combine with the backend's own
            plugin to install it and, on several nodes, to initialise its distributed runtime:
            ``plugins=[sky.plugins.jax(), sky.plugins.keras(backend="jax")]``.

    Raises:
        ConfigError: ``backend`` is not one of the three, when the plugin is made.

    >>> import skyward as sky
    >>> plugin = sky.plugins.keras(backend="jax")
    >>> plugin.name
    'keras'
    """
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ConfigError("backend", '"jax", "torch" or "tensorflow"', backend)
    return Plugin(
        "keras",
        transform=functools.partial(_transform, backend=backend),
        around_app=functools.partial(_pin_backend, backend=backend),
    )
