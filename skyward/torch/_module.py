"""``torch.sky``: what torch asks of an accelerator backend's module.

Once a ``sky`` device is open, torch takes ``sky`` for this process's accelerator: helpers that
never touch a ``sky`` tensor (``torch.random.fork_rng``, ``torch.utils.checkpoint``, autocast)
consult this module. It answers as ``torch.cuda`` does, so that CPU code runs as before:

- generator state per device (``get_rng_state``/``set_rng_state``, ``..._all``), read from and
  written to the node's own generator, in order with the device's operations;
- the current device (``current_device``, ``set_device``, ``device(i)`` as a context manager,
  per thread), ``device_count``, ``is_available``, ``synchronize``;
- ``get_amp_supported_dtype`` (autocast on ``sky``: float16 and bfloat16, as on the node);
- memory figures from the node (``memory_allocated``, ``memory_stats``...).

A device index no open device has (one closed since) reads as an empty state and ignores a state
set, so ``fork_rng`` over ``range(device_count())`` works whatever was closed.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from skyward.errors import DeviceError
from skyward.torch import _autocast, _copies
from skyward.torch._backend import BACKEND, RemoteDevice, _device, _devices
from skyward.torch._wire import OP_RNG, Blob

_current = threading.local()


def _index(device: Any) -> int:
    """The index ``device`` names: an int, ``"sky:1"``, a ``torch.device``, or None (current)."""
    if device is None:
        return DeviceModule.current_device()
    if isinstance(device, int):
        return device
    d = torch.device(device)
    if d.type != "sky":
        raise ValueError(f"expected a sky device, got {d}")
    return DeviceModule.current_device() if d.index is None else d.index


def _open(device: Any) -> RemoteDevice | None:
    return _devices.get(_index(device))


class _DeviceContext:
    """``with torch.sky.device(i):``: ``i`` is the current ``sky`` device inside (this thread)."""

    def __init__(self, device: Any):
        self.index = -1 if device is None else _index(device)
        self.before: int | None = None

    def __enter__(self) -> None:
        self.before = getattr(_current, "index", None)
        if self.index >= 0:
            _current.index = self.index

    def __exit__(self, *exc: Any) -> None:
        _current.index = self.before


class DeviceModule:
    """The object torch registers as ``torch.sky``."""

    device = _DeviceContext
    #: (checkpointing saves and restores a backend's generators only when this is set)
    _initialized = True

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def is_initialized() -> bool:
        return True

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    @staticmethod
    def device_count() -> int:
        return max(_devices, default=-1) + 1

    @staticmethod
    def current_device() -> int:
        index = getattr(_current, "index", None)
        if index is not None:
            return index
        return min(_devices, default=0)

    @staticmethod
    def set_device(device: Any) -> None:
        _current.index = _index(device)

    # -- generators --------------------------------------------------------------------------------
    @staticmethod
    def manual_seed_all(seed: int) -> None:
        for dev in list(_devices.values()):
            dev.seed(int(seed))

    @staticmethod
    def manual_seed(seed: int) -> None:
        dev = _open(None)
        if dev is not None:
            dev.seed(int(seed))

    @staticmethod
    def get_rng_state(device: Any = "sky") -> torch.Tensor:
        """The generator state of the node's device (one round trip), as a CPU byte tensor."""
        dev = _open(device)
        if dev is None:
            return torch.empty(0, dtype=torch.uint8)
        blob: Blob = dev.sync(("rng",))
        return blob.tensor()

    @staticmethod
    def set_rng_state(new_state: torch.Tensor, device: Any = "sky") -> None:
        """Set the node device's generator, in order with the operations queued before."""
        dev = _open(device)
        if dev is None or new_state.numel() == 0:
            return
        state = Blob.of(new_state.to("cpu", torch.uint8), copy=True)
        with dev._lock:
            dev.check_open()
            dev.queue((OP_RNG, (state,), None, None))

    @staticmethod
    def get_rng_state_all() -> list[torch.Tensor]:
        return [DeviceModule.get_rng_state(i) for i in range(DeviceModule.device_count())]

    @staticmethod
    def set_rng_state_all(new_states: Any) -> None:
        for i, state in enumerate(new_states):
            DeviceModule.set_rng_state(state, i)

    # -- autocast ----------------------------------------------------------------------------------
    @staticmethod
    def get_amp_supported_dtype() -> list[torch.dtype]:
        return [torch.float16, torch.bfloat16]

    # -- waiting and memory ------------------------------------------------------------------------
    @staticmethod
    def synchronize(device: Any = None) -> None:
        """Wait until every operation queued for ``device`` (all sky devices if None) has run."""
        devs = list(_devices.values()) if device is None else [_device(_index(device))]
        for dev in devs:
            dev.wait()

    @staticmethod
    def memory_stats(device: Any = None) -> dict[str, int]:
        """The node's figures for ``device``, after every operation queued before (one round trip):
        ``session.allocated`` (bytes of this device's tensors on the node, each storage once), and
        on a GPU node ``torch.cuda.memory_stats``'s keys."""
        return dict(_device(_index(device)).sync(("memory",)))

    @staticmethod
    def memory_allocated(device: Any = None) -> int:
        stats = DeviceModule.memory_stats(device)
        return int(stats.get("allocated_bytes.all.current", stats["session.allocated"]))

    @staticmethod
    def max_memory_allocated(device: Any = None) -> int:
        stats = DeviceModule.memory_stats(device)
        return int(stats.get("allocated_bytes.all.peak", stats["session.allocated"]))

    @staticmethod
    def memory_reserved(device: Any = None) -> int:
        stats = DeviceModule.memory_stats(device)
        return int(stats.get("reserved_bytes.all.current", stats["session.allocated"]))


_registered = False
_registry_lock = threading.Lock()


def register() -> None:
    """Register the ``sky`` backend with torch (once per process): this module as ``torch.sky``,
    the factories torch calls for ``device="sky:N"``, and autocast's kernels."""
    global _registered
    with _registry_lock:
        if _registered:
            return
        from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

        if torch._C._get_privateuse1_backend_name() not in ("privateuseone", BACKEND):
            raise DeviceError("another library already registered torch's custom device "
                              f"({torch._C._get_privateuse1_backend_name()!r}); the sky device needs it", op="")
        _setup_privateuseone_for_python_backend(BACKEND, backend_module=DeviceModule())
        lib = torch.library.Library("aten", "IMPL")
        lib.impl("empty.memory_format", _copies.empty, "PrivateUse1")
        lib.impl("empty_strided", _copies.empty_strided, "PrivateUse1")
        lib.impl("_copy_from", _copies.copy_from, "PrivateUse1")
        lib.impl("_copy_from_and_resize", _copies.copy_from_and_resize, "PrivateUse1")
        lib.impl("_efficientzerotensor", _copies.efficient_zeros, "PrivateUse1")
        every = torch.library.Library("_", "IMPL")
        _autocast.register(lib, every)
        globals()["_libs"] = (lib, every)  # (the registrations live as long as the library objects)
        _registered = True
