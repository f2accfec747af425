"""``Compute`` (a one-node pool whose node lends its torch device), ``@compute``, and
``pool.device(kind, node=i)`` on any open :class:`~skyward.ComputePool`."""

from __future__ import annotations

import functools
import inspect
import sys
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

__all__ = ["Cluster", "Compute", "compute", "open_device"]


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


def _torch_in_image(image: Any, info: PoolInfo) -> Any:
    """Every node needs the client's torch (the same version: operations must agree) and numpy."""
    from skyward.plugins._torch import DEFAULT_CUDA, _transform, requirement

    names = {p.split("=")[0].split(">")[0].split("<")[0].strip().lower() for p in image.pip}
    if "torch" in names:
        return image
    version = torch.__version__.split("+")[0]
    return _transform(image, info, packages=(requirement("torch", version),), cuda=DEFAULT_CUDA)


_DEVICE_PLUGIN = Plugin("sky-device", transform=_torch_in_image)


class Compute:
    """One node whose torch device the client uses: ``node.device("cuda")`` is
    ``torch.device("sky:N")``, and tensors moved there live on the node.

    Takes :class:`~skyward.ComputePool`'s parameters (``provider``, ``accelerator``, ``image``,
    ``plugins``, ...) except ``nodes`` (one) and ``executor`` (threads). Use it as a context
    manager, ``with`` or ``async with``; leaving it closes the devices and releases the node on
    every exit path.
    """

    def __init__(self, name: str | None = None, **pool_options: Any):
        for fixed in ("nodes", "executor", "processes_per_node"):
            if fixed in pool_options:
                raise ConfigError(fixed, "no value: a Compute is one node, one worker process, threads",
                                  pool_options[fixed])
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise ConfigError("name", "a non-empty string (or None)", name)
        from skyward.pool import ComputePool

        plugins = list(pool_options.pop("plugins", ()) or ())
        pool_options.setdefault("console", False)
        self.name = name or "compute"
        """What this compute is called in messages."""
        self.pool = ComputePool(nodes=1, plugins=[_DEVICE_PLUGIN, *plugins], **pool_options)
        """The one-node :class:`~skyward.ComputePool` behind it (open while the compute is)."""

    def device(self, kind: str = "cpu") -> torch.device:
        """The node's ``kind`` device (``"cpu"``, ``"cuda"``, ``"cuda:1"``) as a ``sky`` device."""
        return self.pool.device(kind, node=0)

    # -- context managers -------------------------------------------------------------------------
    def __enter__(self) -> Compute:
        self.pool.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.pool.__exit__(*exc)

    async def __aenter__(self) -> Compute:
        return self.__enter__()

    async def __aexit__(self, *exc: Any) -> None:
        self.__exit__(*exc)

    def __repr__(self) -> str:
        return f"Compute(name={self.name!r}, provider={self.pool.provider!r}, state={self.pool._state})"


class Cluster:
    """Several :class:`Compute` at once: ``with Cluster(a, b) as (a, b)`` starts each one (in
    order) and leaves them all, on every exit path, the last started first.

    Their devices can be used together in one program; a copy between two of them
    (``q.copy_(p)``, ``t.to(other)``) goes from node to node, not through the client (see
    :mod:`skyward.torch`). The computes may use different providers.
    """

    def __init__(self, *computes: Compute):
        if not computes:
            raise ConfigError("computes", "one or more Compute", computes)
        for i, c in enumerate(computes):
            if not isinstance(c, Compute):
                raise ConfigError(f"computes[{i}]", "a skyward.torch.Compute", c)
        if len({id(c) for c in computes}) != len(computes):
            raise ConfigError("computes", "distinct Compute objects (each one is its own node)",
                              [c.name for c in computes])
        self.computes = computes
        """The computes, in the order given (and entered)."""

    def __enter__(self) -> tuple[Compute, ...]:
        started: list[Compute] = []
        try:
            for c in self.computes:
                c.__enter__()
                started.append(c)
        except BaseException:
            self._leave(started, sys.exc_info())
            raise
        return self.computes

    def __exit__(self, *exc: Any) -> None:
        self._leave(list(self.computes), exc)

    @staticmethod
    def _leave(started: list[Compute], exc: Any) -> None:
        """Leave every compute in ``started`` (last first) even when one fails; raise the first
        failure afterwards (unless an exception is already on its way out)."""
        failure: BaseException | None = None
        for c in reversed(started):
            try:
                c.__exit__(*exc)
            except BaseException as e:  # (the others are still left)
                failure = failure or e
        if failure is not None and exc[0] is None:
            raise failure

    async def __aenter__(self) -> tuple[Compute, ...]:
        return self.__enter__()

    async def __aexit__(self, *exc: Any) -> None:
        self.__exit__(*exc)

    def __repr__(self) -> str:
        return f"Cluster({', '.join(repr(c) for c in self.computes)})"


def compute(fn: Callable[..., Any] | None = None, /, *, name: str | None = None, **pool_options: Any) -> Any:
    """Run a function with a :class:`Compute` of its own as its first argument.

    ``@compute(provider=..., ...)`` on ``def f(node, *args)`` or ``async def f(node, *args)``
    makes ``f(*args)`` open a Compute, call the function with it, and close it whatever
    happens. The async form returns a coroutine (``asyncio.run(f())``).
    """

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(fn):
            raise ConfigError("fn", "a function taking the Compute as its first argument", fn)
        label = name or getattr(fn, "__name__", None)
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                async with Compute(label, **pool_options) as node:
                    return await fn(node, *args, **kwargs)

            return run_async

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            with Compute(label, **pool_options) as node:
                return fn(node, *args, **kwargs)

        return run

    if fn is not None:
        return decorate(fn)
    return decorate

