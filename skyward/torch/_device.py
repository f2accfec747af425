"""``pool.device(kind, node=i)``: a session on a node's worker, its link, and the image plugin
that puts the client's torch on every node.

Apart from :mod:`skyward.torch._compute` (``Compute`` and ``Cluster``, built on a
:class:`~skyward.ComputePool`) because the pool calls :func:`open_device`: this module knows a
pool only through the attributes it reads, so it never imports the pool.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import torch

from skyward.compute import function_blob
from skyward.errors import ConfigError
from skyward.plugins._base import Plugin, PoolInfo
from skyward.protocol import dumps_payload
from skyward.torch import _backend, _module, _server

__all__ = ["open_device", "torch_in_image"]


class PoolLink(_backend.Link):
    """A device's way to its node: tasks on that node's first worker process."""

    def __init__(self, connection: Any):
        self.connection = connection
        self.node = connection.node

    def submit(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Future[Any]:
        return self.connection.submit(dumps_payload((function_blob(fn), args, {})), "sky", None)

    def call(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        return self.connection.call(dumps_payload((function_blob(fn), args, {})), "sky", None)

    def lost(self) -> BaseException | None:
        return self.connection.lost  # (set once the loss is known, with its cause)


def open_device(pool: Any, kind: str, node: int) -> torch.device:
    """``pool.device(kind, node=node)``: open a session on the node's worker (one round trip)."""
    if not isinstance(kind, str) or not kind.strip():
        raise ConfigError("kind", 'a device type of the node, such as "cpu", "cuda" or "cuda:1"', kind)
    if isinstance(node, bool) or not isinstance(node, int) or not 0 <= node < pool.nodes:
        raise ConfigError("node", f"a node of this pool, 0..{pool.nodes - 1}", node)
    if pool.executor == "process":
        raise ConfigError("executor", "'thread' for a pool that lends a torch device (tensors live in the "
                          "worker process)", pool.executor)
    known = pool._sky_devices.get((node, kind))
    if known is not None and known.closed is None:
        return known.torch_device
    link = PoolLink(pool._connection(node))
    key = uuid.uuid4().hex
    # (node-to-node copies arrive at the address the pool's other nodes reach this one at)
    address = pool.instances[node].private_addr
    _module.register()
    dev = _backend.attach(link, kind, "?", key)
    try:
        info = link.call(_server.open_session, (key, dev.index, kind, address, _backend.SECRET))
    except BaseException:
        _backend.detach(dev, "it could not be opened")
        raise
    dev.real = info["device"]
    dev.peer = info["peer"]
    remote_torch = info["torch"]
    if remote_torch.split("+")[0] != torch.__version__.split("+")[0]:
        import warnings

        warnings.warn(f"node {node} runs torch {remote_torch}, this client {torch.__version__}: operations "
                      "may differ (pin the same version in the image)", stacklevel=3)
    pool._sky_devices[(node, kind)] = dev
    pool._on_stop.append(lambda: _backend.detach(dev, "its pool was closed"))
    return dev.torch_device


def torch_in_image(image: Any, info: PoolInfo) -> Any:
    """Every node needs the client's torch (the same version: operations must agree) and numpy."""
    from skyward.plugins._torch import DEFAULT_CUDA, _transform, requirement

    names = {p.split("=")[0].split(">")[0].split("<")[0].strip().lower() for p in image.pip}
    if "torch" in names:
        return image
    version = torch.__version__.split("+")[0]
    return _transform(image, info, packages=(requirement("torch", version),), cuda=DEFAULT_CUDA)


_DEVICE_PLUGIN = Plugin("sky-device", transform=torch_in_image)
