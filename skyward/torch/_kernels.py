"""What a node's device session runs besides aten operations: operator lookup, the device's
generator, custom operators the client defined, and errors reworded to name the operation.

Runs on the worker: nothing here imports the client's backend.
"""

from __future__ import annotations

import importlib
import pickle
from typing import Any

import torch

from skyward.errors import DeviceError
from skyward.torch._wire import OP_DEFINE

_ops: dict[str, Any] = {}


def op(name: str) -> Any:
    """``torch.ops.aten.add.Tensor`` from ``"aten.add.Tensor"`` (cached)."""
    return _ops.get(name) or _lookup(name)


def define(qualname: str, module: str | None, schema: str, mutates: list[str], fn: bytes | None) -> None:
    """Make the client's custom operator ``qualname`` exist in this process (once)."""
    namespace, name = qualname.split("::")

    def exists() -> bool:
        return hasattr(getattr(torch.ops, namespace), name)

    if exists():
        return
    if module and module != "__main__":
        try:
            importlib.import_module(module)
        except ImportError:
            pass
        if exists():
            return
    if fn is None:
        raise DeviceError(f"the custom operator {qualname} is not defined on the node, and the client could "
                          "not send its definition (register it with torch.library.custom_op)", op=OP_DEFINE)
    torch.library.custom_op(qualname, pickle.loads(fn), mutates_args=mutates, schema=schema)


def reworded(exc: Exception, message: str) -> Exception:
    """``exc``'s type with ``message`` (a DeviceError where the type takes no message)."""
    try:
        new = type(exc)(message)
    except Exception:
        return DeviceError(message, op="")
    return new if str(new) == message else DeviceError(message, op="")


def _lookup(name: str) -> Any:
    namespace, packet, overload = name.split(".")
    fn = getattr(getattr(getattr(torch.ops, namespace), packet), overload)
    _ops[name] = fn
    return fn


def seed(device: torch.device, value: int) -> None:
    torch.manual_seed(value)
    if device.type == "cuda":
        torch.cuda.manual_seed_all(value)


def rng_state(device: torch.device) -> torch.Tensor:
    if device.type == "cuda":
        return torch.cuda.get_rng_state(device)
    return torch.get_rng_state()


def set_rng_state(device: torch.device, state: torch.Tensor) -> None:
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)
