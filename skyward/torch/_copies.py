"""Copies: a ``sky`` tensor to the client, client tensors to a node, one node's tensor to
another's (worker to worker), and the factories torch calls for ``device="sky:N"``."""

from __future__ import annotations

import itertools
import warnings
from typing import Any

import torch

from skyward.torch import _dispatch
from skyward.torch._backend import BACKEND, RemoteDevice, _device
from skyward.torch._tensor import SkyTensor, new_handle
from skyward.torch._wire import OP_RECV, OP_SEND, Blob, DeviceRef, Ref

_transfers = itertools.count(1)
#: (sending worker, receiving worker) -> None (direct) or why the sender cannot reach the other.
_routes: dict[tuple[str, str], str | None] = {}

def fetch(t: SkyTensor) -> torch.Tensor:
    """The data of ``t``, here (one round trip)."""
    blob: Blob = t._dev.sync(("fetch", t._tid))
    return blob.tensor()


def _to_copy(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    src = args[0]
    target = kwargs.get("device")
    if target is not None and type(target) is torch.device and target.type != BACKEND:
        local = {k: v for k, v in kwargs.items() if k != "device"}
        if local.get("pin_memory"):
            raise NotImplementedError("pin_memory is not supported on a sky device")
        return func(fetch(src), device=target, **{k: v for k, v in local.items() if k != "pin_memory"})
    if target is not None and type(src) is SkyTensor and _device(target.index) is not src._dev:
        return _cross_copy(src, _device(target.index), kwargs)
    return _dispatch.generic(func, args, kwargs)


def _copy_(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    dst, src = args[0], args[1]
    if type(dst) is not SkyTensor:  # sky -> client
        dst.copy_(fetch(src), **kwargs)
        return dst
    if type(src) is SkyTensor and src._dev is not dst._dev:
        return _cross_copy(src, dst._dev, {}, into=dst)
    return _dispatch.generic(func, args, kwargs)


def _route(a: RemoteDevice, b: RemoteDevice) -> str | None:
    """None when ``a``'s worker can send to ``b``'s directly, else why not (asked once a pair)."""
    pair = (a.peer["worker"], b.peer["worker"])
    if pair not in _routes:
        _routes[pair] = a.sync(("probe", b.peer["address"], b.peer["port"]))
    return _routes[pair]


def _cross_copy(src: SkyTensor, dst: RemoteDevice, kwargs: dict[str, Any], into: SkyTensor | None = None) -> Any:
    """``src`` (on one node) to ``dst`` (another node's device): worker to worker when the two
    can reach each other (no byte through the client), else through the client, with a warning.
    ``into``: copy into this tensor of ``dst`` (``copy_``); otherwise a new tensor (``.to``)."""
    a = src._dev
    if into is not None and torch.broadcast_shapes(into.shape, src.shape) != into.shape:
        raise RuntimeError(f"the size of the source {tuple(src.shape)} must match the destination's "
                           f"{tuple(into.shape)} (or broadcast to it)")
    why = _route(a, dst)
    local = {k: v for k, v in kwargs.items() if k not in ("device", "non_blocking", "copy")}
    if why is not None:
        warnings.warn(f"copying {src.device} -> {dst.torch_device} through the client: the nodes cannot "
                      f"reach each other ({why})", stacklevel=4)
        data = fetch(src)
        if local:
            data = torch.ops.aten._to_copy.default(data, **local)
        if into is not None:
            return into.copy_(data)
        return data.to(dst.torch_device)
    xid = next(_transfers)
    shape, dtype = tuple(src.shape), src.dtype
    with a._lock:
        a.check_open()
        a.queue((OP_SEND, (Ref(src._tid), xid, dst.peer["address"], dst.peer["port"]), None, None))
        a.flush()  # (now: the receiving node waits for these bytes)
    with dst._lock:
        dst.check_open()
        # (every sync point, on any device, waits for the copy to land: see RemoteDevice.sync)
        dst.incoming = True
        if into is not None:
            dst.queue((OP_RECV, (Ref(into._tid), xid, a.peer["worker"], shape, dtype, False), None, None))
            return into
        h = new_handle(dst, shape, _contiguous_strides(shape), 0, dtype)
        dst.queue((OP_RECV, (h._tid, xid, a.peer["worker"], shape, dtype, True), None, None))
    if local:
        return torch.ops.aten._to_copy.default(h, **local)
    return h


_dispatch.SPECIAL.update({
    "aten._to_copy.default": _to_copy,
    "aten.copy_.default": _copy_,
    # (asked by ``t.data = other``: a question about the two handles, answered here)
    "aten._has_compatible_shallow_copy_type.default": lambda func, args, kwargs: type(args[0]) is type(args[1]),
})


def _contiguous_strides(size: Any) -> tuple[int, ...]:
    strides = []
    acc = 1
    for n in reversed(list(size)):
        strides.append(acc)
        acc *= max(int(n), 1)
    return tuple(reversed(strides))


def empty(size: Any, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None,
           memory_format: Any = None) -> SkyTensor:
    if pin_memory:
        raise NotImplementedError("pin_memory is not supported on a sky device")
    dev = _device(device.index)
    dtype = dtype or torch.get_default_dtype()
    if memory_format is None or memory_format == torch.contiguous_format or memory_format == torch.preserve_format:
        stride = _contiguous_strides(size)
    else:
        stride = torch.empty(size, device="meta", memory_format=memory_format).stride()
    with dev._lock:
        dev.check_open()
        h = new_handle(dev, tuple(size), stride, 0, dtype)
        dev.queue(("aten.empty_strided.default", (tuple(size), stride), {"dtype": dtype, "device": DeviceRef(dev.index)},
                   [h._tid]))
    return h


def empty_strided(size: Any, stride: Any, dtype: Any = None, layout: Any = None, device: Any = None,
                   pin_memory: Any = None) -> SkyTensor:
    if pin_memory:
        raise NotImplementedError("pin_memory is not supported on a sky device")
    dev = _device(device.index)
    dtype = dtype or torch.get_default_dtype()
    with dev._lock:
        dev.check_open()
        h = new_handle(dev, tuple(size), tuple(stride), 0, dtype)
        dev.queue(("aten.empty_strided.default", (tuple(size), tuple(stride)),
                   {"dtype": dtype, "device": DeviceRef(dev.index)}, [h._tid]))
    return h


def copy_from(src: Any, dst: Any, non_blocking: bool = False) -> Any:
    """``aten::_copy_from`` (torch's copy between two backends, as ``torch.tensor(..., device=)``
    makes it): the same as ``dst.copy_(src)``."""
    return _copy_(torch.ops.aten.copy_.default, (dst, src), {})


def copy_from_and_resize(src: Any, dst: Any) -> Any:
    if tuple(dst.shape) != tuple(src.shape):
        dst.resize_(src.shape)
    return _copy_(torch.ops.aten.copy_.default, (dst, src), {})


def efficient_zeros(size: Any, dtype: Any = None, layout: Any = None, device: Any = None,
                    pin_memory: Any = None) -> SkyTensor:
    """``aten::_efficientzerotensor`` (autograd's zero gradients, as in ``sgn``'s backward): zeros."""
    return empty(size, dtype=dtype, device=device).zero_()
