"""``torch.sky``: what torch asks of an accelerator backend's module."""

from __future__ import annotations

from typing import Any

import torch

from skyward.torch._backend import _device, _devices


class DeviceModule:
    """``torch.sky``: what torch asks of a backend's module (seeding, counts)."""

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
        return 0

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        for dev in list(_devices.values()):
            dev.seed(int(seed))

    manual_seed = manual_seed_all

    @staticmethod
    def synchronize(device: Any = None) -> None:
        """Wait until every operation queued for ``device`` (all sky devices if None) has run."""
        devs = list(_devices.values()) if device is None else [_device(torch.device(device).index)]
        for dev in devs:
            dev.wait()

