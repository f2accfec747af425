"""``sky.plugins.torch``: install PyTorch on every node and join the workers in one process group.

Two hooks:

* ``transform`` (client): appends ``torch`` (and optionally ``torchvision``/``torchaudio``;
  ``numpy`` too unless the image already names it, since torch warns without it)
  to the image's pip packages and the matching ``download.pytorch.org`` wheel index to its
  indexes — CUDA wheels when the pool's accelerator runs CUDA, CPU wheels otherwise. What
  the image and earlier plugins already had is kept, in order.
* ``around_app`` (worker, once per worker process): on a pool of two or more nodes, exports
  the variables ``torchrun`` would (``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``,
  ``RANK``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``NODE_RANK``) and
  ``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` (the interface that routes to the head), calls
  ``torch.distributed.init_process_group`` and, when the worker stops, destroys the group.
  The rendezvous store on rank 0 listens only on the address its peers use (``MASTER_ADDR``;
  loopback on the Local provider, where gloo and NCCL are kept on loopback too).
  A single-node pool sets nothing and initialises nothing.

:func:`setup_process_group` (in :mod:`skyward.plugins._torch_group`, the worker side) is the
one place that does the worker-side work; the plugin and the ``@sky.integrations.torch``
decorator both call it.

torch is imported inside the worker-side functions only: importing this module (which the
client does to build the plugin) never imports torch.
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING

from skyward.errors import ConfigError
from skyward.plugins._base import PoolInfo, Plugin

# The worker side (the process group): re-exported for skyward.integrations.
from skyward.plugins._torch_group import (
    DEFAULT_TIMEOUT,
    Backend,
    _process_group,
    distributed_env,
    host_share,
    node_devices,
    setup_process_group,
)

if TYPE_CHECKING:
    from skyward.image import Image

__all__ = ["DEFAULT_TIMEOUT", "Backend", "distributed_env", "host_share", "node_devices", "requirement",
           "setup_process_group", "torch"]

_BACKENDS = (None, "nccl", "gloo")
_CUDA_RE = re.compile(r"^cu\d{3}$")
# A bare version ("2.3.0", "2.3.0+cu121", "2.*") is pinned with ==; anything that starts with
# a PEP 440 comparison operator is a constraint and is passed through unchanged.
_BARE_VERSION_RE = re.compile(r"^[0-9][0-9A-Za-z.+!*\-]*$")
_OPERATORS = ("===", "==", "!=", "~=", ">=", "<=", ">", "<")
_WHEELS = "https://download.pytorch.org/whl/{}"
#: The CUDA wheel flavour installed on CUDA nodes unless told otherwise.
DEFAULT_CUDA = "cu128"


# -- validation (shared with skyward.integrations) ------------------------------------------------


def check_backend(backend: object) -> Backend | None:
    """Return ``backend`` if it is None, "nccl" or "gloo"; else raise ConfigError."""
    if backend not in _BACKENDS:
        raise ConfigError("backend", 'None (auto: "nccl" with CUDA, else "gloo"), "nccl" or "gloo"', backend)
    return backend  # type: ignore[return-value]


def check_timeout(timeout: object) -> float:
    """Return ``timeout`` as float seconds if it is a positive number; else raise ConfigError."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
        raise ConfigError("timeout", "a positive number of seconds (not inf or nan)", timeout)
    return float(timeout)


def _check_version(parameter: str, value: object, *, optional: bool) -> str | None:
    if value is None and optional:
        return None
    accepted = '"latest", a version like "2.3.0", or a constraint like ">=2.3"'
    if optional:
        accepted += " (or None to skip)"
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(parameter, accepted, value)
    text = value.strip()
    if text == "latest" or text.startswith(_OPERATORS) or _BARE_VERSION_RE.match(text):
        return text
    raise ConfigError(parameter, accepted, value)


# -- client side ----------------------------------------------------------------------------------


def requirement(package: str, version: str) -> str:
    """The pip requirement for ``package`` at ``version``.

    >>> requirement("torch", "latest"), requirement("torch", "2.3.0"), requirement("torch", ">=2.3")
    ('torch', 'torch==2.3.0', 'torch>=2.3')
    """
    if version == "latest":
        return package
    if version.startswith(_OPERATORS):
        return package + version
    return f"{package}=={version}"


def _names_numpy(requirement: str) -> bool:
    return re.split(r"[\s<>=!~;\[@]", requirement.strip(), maxsplit=1)[0].lower() == "numpy"


def _transform(image: Image, cluster: PoolInfo, *, packages: tuple[str, ...], cuda: str) -> Image:
    index = _WHEELS.format(cuda if cluster.cuda else "cpu")
    # torch does not depend on numpy but warns on import without it ("Failed to initialize
    # NumPy") and tensor.numpy() fails: every node gets numpy unless the image pins its own.
    if not any(_names_numpy(p) for p in image.pip):
        packages = (*packages, "numpy")
    return image.with_pip(*packages, index=index)


# -- the factory ----------------------------------------------------------------------------------


def torch(
    backend: Backend | None = None,
    cuda: str = DEFAULT_CUDA,
    version: str = "latest",
    vision: str | None = None,
    audio: str | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT,
) -> Plugin:
    """PyTorch on every node, and a ready ``torch.distributed`` process group on multi-node pools.

    Args:
        backend: ``"nccl"``, ``"gloo"``, or None to choose per worker (nccl with CUDA).
        cuda: CUDA wheel flavour (``"cu118"``, ``"cu121"``, ``"cu124"``, ``"cu128"``...),
            used when the pool's accelerator runs CUDA; otherwise CPU wheels are installed.
        version: torch version: ``"latest"`` (unpinned), ``"2.3.0"`` (``==``), or a
            constraint such as ``">=2.3"`` (passed through).
        vision: torchvision version, same forms; None does not install it.
        audio: torchaudio version, same forms; None does not install it.
        timeout: seconds each rank waits for the others, at start and in every collective.

    Raises:
        ConfigError: for any invalid argument, when the plugin is made.

    >>> import skyward as sky
    >>> with sky.ComputePool(nodes=2, plugins=[sky.plugins.torch()]) as pool:  # doctest: +SKIP
    ...     ranks = rank() @ pool     # a task calling torch.distributed.get_rank() -> [0, 1]
    """
    backend = check_backend(backend)
    if not isinstance(cuda, str) or not _CUDA_RE.match(cuda):
        raise ConfigError("cuda", 'a CUDA wheel suffix like "cu118", "cu121", "cu124" or "cu128"', cuda)
    packages = [requirement("torch", _check_version("version", version, optional=False))]  # type: ignore[arg-type]
    for name, parameter, value in (("torchvision", "vision", vision), ("torchaudio", "audio", audio)):
        checked = _check_version(parameter, value, optional=True)
        if checked is not None:
            packages.append(requirement(name, checked))
    return Plugin(
        "torch",
        transform=functools.partial(_transform, packages=tuple(packages), cuda=cuda),
        around_app=functools.partial(_process_group, backend=backend, timeout=check_timeout(timeout)),
    )
