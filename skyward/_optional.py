"""The one place optional dependencies are imported.

Skyward's core needs only cloudpickle, pydantic and rich. Everything else belongs to an extra
(``pip install 'skyward[ssh]'``) and is imported through :func:`require`, which turns a
missing package into a :class:`~skyward.errors.MissingDependency` that names the extra to
install, instead of a bare ``ModuleNotFoundError`` from deep inside a provider.

>>> paramiko = require("paramiko", "sky.SSH")          # doctest: +SKIP

Guarantees:

1. Nothing is imported until :func:`require` is called: importing this module is free.
2. A package that is installed is returned as ``importlib.import_module`` returns it.
3. A missing package raises ``MissingDependency`` (a ``SkywardError`` and an ``ImportError``,
   so ``except ImportError`` keeps working) with the package, the feature that needs it and
   the ``pip install`` line; the original error is its ``__cause__``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from skyward.errors import MissingDependency

__all__ = ["EXTRAS", "require"]

# top-level package -> the extra that installs it (see pyproject.toml)
EXTRAS: dict[str, str] = {
    "paramiko": "ssh",
    "cryptography": "ssh",  # paramiko's own dependency; AWS key pairs use it directly
    "boto3": "aws",
    "botocore": "aws",
    "torch": "torch",
    "numpy": "examples",
    "sklearn": "examples",
    "joblib": "examples",
    "jax": "jax",
    "mkdocs": "docs",
    "starlette": "dashboard",
    "uvicorn": "dashboard",
}


def require(module: str, feature: str, *, extra: str | None = None) -> ModuleType:
    """Import ``module`` (dotted names allowed) for ``feature``, or say which extra installs it.

    ``feature`` is what the user asked for, in their words ("sky.SSH", "skyward ls");
    ``extra`` overrides the extra named in :data:`EXTRAS` (a package several extras carry).
    Raises :class:`~skyward.errors.MissingDependency` when the package is not installed.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        missing = getattr(exc, "name", None) or module
        # Only a missing package of our own list is ours to explain; an ImportError raised
        # inside an installed package (a broken install) is not hidden behind an install hint.
        top = missing.partition(".")[0]
        if top not in EXTRAS:
            raise
        raise MissingDependency(top, feature, extra or EXTRAS[top]) from exc
