"""Plugins: the types (:class:`Plugin`, :class:`PoolInfo`, in ``_base``) and the plugins that ship
with Skyward, each a function returning a :class:`~skyward.Plugin`.

>>> import skyward as sky
>>> plugins = [sky.plugins.torch(), sky.plugins.huggingface(token="...")]  # doctest: +SKIP

The framework itself (torch, jax, ...) is imported inside the hooks, on the worker, never
when ``skyward`` or ``skyward.plugins`` is imported.
"""

from __future__ import annotations

import importlib
from typing import Any

from skyward.plugins._base import PoolInfo, Plugin

__all__ = ["PoolInfo", "Plugin", "huggingface", "jax", "joblib", "keras", "sklearn", "torch"]

_FACTORIES = {
    "torch": "skyward.plugins._torch",
    "jax": "skyward.plugins._jax",
    "keras": "skyward.plugins._keras",
    "huggingface": "skyward.plugins._huggingface",
    "joblib": "skyward.plugins._joblib",
    "sklearn": "skyward.plugins._sklearn",
}


def __getattr__(name: str) -> Any:
    module = _FACTORIES.get(name)
    if module is None:
        raise AttributeError(f"module 'skyward.plugins' has no attribute {name!r}")
    factory = getattr(importlib.import_module(module), name)
    globals()[name] = factory
    return factory
