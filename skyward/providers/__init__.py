"""Providers acquire and release machines: ``Local`` (this machine), ``SSH``, ``AWS``, ``Slurm``.

Only ``Local`` is imported eagerly; the others load their SDKs lazily.
"""

from __future__ import annotations

from typing import Any

from skyward.providers.base import Instance, PoolSpec, Provider
from skyward.providers.local import Local

__all__ = ["AWS", "Instance", "Local", "PoolSpec", "Provider", "SSH", "Slurm"]


def __getattr__(name: str) -> Any:
    if name == "AWS":
        from skyward.providers.aws import AWS

        return AWS
    if name == "SSH":
        from skyward.providers.ssh import SSH

        return SSH
    if name == "Slurm":
        from skyward.providers.slurm import Slurm

        return Slurm
    raise AttributeError(f"module 'skyward.providers' has no attribute {name!r}")
