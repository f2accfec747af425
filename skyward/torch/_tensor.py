"""``SkyTensor``: a tensor on a ``sky`` device, its metadata here and its data on a node."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from skyward.torch._backend import RemoteDevice


class _ForModuleMoves:
    """``__tensor_flatten__``/``__tensor_unflatten__``, seen only by ``nn.Module._apply``.

    ``_apply`` (``model.to(device)``) swaps a traceable wrapper subclass's tensors into the
    module's existing parameters (``torch.utils.swap_tensors``) instead of wrapping them in new
    ones; so a parameter keeps its identity, and weights tied across modules stay tied. Offered
    to everyone, the same two names would tell torch.compile it can trace a ``sky`` tensor,
    which it cannot (it takes the storage): there they are absent, and TorchDynamo falls back to
    eager as before."""

    def __init__(self, fn: Any):
        self.fn = fn

    def __get__(self, obj: Any, owner: Any) -> Any:
        frame = sys._getframe(1)
        for _ in range(4):  # (_apply -> is_traceable_wrapper_subclass -> ..._protocol -> hasattr)
            if frame is None:
                break
            if frame.f_code is _APPLY:
                return self.fn.__get__(obj, owner)
            frame = frame.f_back
        raise AttributeError("__tensor_flatten__")


_APPLY = torch.nn.Module._apply.__code__


def _flatten(self: Any) -> tuple[list[str], Any]:
    return [], None  # (a handle has no inner tensors)


def _unflatten(inner: Any, meta: Any, size: Any, stride: Any) -> Any:
    raise NotImplementedError("a sky tensor cannot be rebuilt from parts")


class SkyTensor(torch.Tensor):
    """A tensor on a ``sky`` device: its metadata here, its data on a node."""

    _dev: RemoteDevice
    _tid: int
    #: Where every aten operation on a handle goes (skyward.torch._dispatch.dispatch).
    handler: Any
    __torch_function__ = torch._C._disabled_torch_function_impl
    __tensor_flatten__ = _ForModuleMoves(_flatten)
    __tensor_unflatten__ = _ForModuleMoves(staticmethod(_unflatten))

    @staticmethod
    def __new__(cls, dev: RemoteDevice, tid: int, size: Any, stride: Any, offset: int, dtype: torch.dtype) -> SkyTensor:
        t = torch.Tensor._make_wrapper_subclass(
            cls, size, strides=stride, storage_offset=offset, dtype=dtype, device=dev.torch_device
        )
        t._dev = dev
        t._tid = tid
        return t

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __del__(self) -> None:
        dev = self.__dict__.get("_dev")
        if dev is not None:
            dev.free(self._tid)

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        return SkyTensor.handler(func, args, kwargs or {})

    # -- values the client asks for --------------------------------------------------------------
    def __repr__(self, *, tensor_contents: Any = None) -> str:
        text = repr(self.detach().cpu())
        suffix = f", device='{self.device}'"
        if self.grad_fn is not None:
            suffix += f", grad_fn=<{type(self.grad_fn).__name__}>"
        elif self.requires_grad:
            suffix += ", requires_grad=True"
        return text[:-1] + suffix + ")" if text.endswith(")") else text

    def __reduce_ex__(self, proto: Any) -> Any:
        # (torch.save and pickle store the data, as a CPU tensor: a handle means nothing elsewhere;
        # a parameter stays a parameter)
        data = self.detach().cpu()
        if self.__dict__.get("_is_param"):
            data = torch.nn.Parameter(data, requires_grad=self.requires_grad)
        return data.__reduce_ex__(proto)

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        if id(self) in memo:
            return memo[id(self)]
        import copy

        with torch.no_grad():
            new = self.clone()
        new.requires_grad_(self.requires_grad)
        for name, value in self.__dict__.items():
            if name not in ("_dev", "_tid"):
                new.__dict__[name] = copy.deepcopy(value, memo)
        if self.grad is not None:
            new.grad = copy.deepcopy(self.grad, memo)
        memo[id(self)] = new
        return new

    def backward(self, *args: Any, **kwargs: Any) -> None:
        # The autograd engine's per-device threads do not know this device: run on this thread.
        with torch.autograd.set_multithreading_enabled(False):
            super().backward(*args, **kwargs)

    def tolist(self) -> Any:
        return self.detach().cpu().tolist()

    def numpy(self, *, force: bool = False) -> Any:
        raise TypeError(f"can't convert {self.device} device type tensor to numpy: use Tensor.cpu() to copy "
                        "the tensor to host memory first")

    def __format__(self, spec: str) -> str:
        if self.dim() == 0 and not self.requires_grad:
            return self.item().__format__(spec)
        return self.detach().cpu().__format__(spec)

    def data_ptr(self) -> int:
        raise NotImplementedError("data_ptr() is not supported on a sky device: the data lives on a node "
                                  "(copy it with .cpu() first)")

    def untyped_storage(self) -> Any:
        raise NotImplementedError("storage access is not supported on a sky device: the data lives on a node "
                                  "(copy it with .cpu() first)")

    storage = untyped_storage  # type: ignore[assignment]

    def pin_memory(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("pin_memory() is not supported on a sky device (pin the CPU tensor before .to())")



def _not_ready(func: Any, args: Any, kwargs: Any) -> Any:
    raise RuntimeError("skyward.torch._dispatch is not loaded (import skyward.torch)")


SkyTensor.handler = staticmethod(_not_ready)  # (skyward.torch._dispatch puts its own here)


def new_handle(dev: RemoteDevice, size: Any, stride: Any, offset: int, dtype: torch.dtype) -> SkyTensor:
    """A new handle on ``dev`` with the next id of its table."""
    dev._tid += 1
    return SkyTensor(dev, dev._tid, size, stride, offset, dtype)
