"""The one place optional dependencies are imported.

Skyward's core needs only cloudpickle, pydantic and rich. Everything else belongs to an extra
(``pip install 'skyward[ssh]'``) and is imported through :func:`require`, which turns a
missing package into a :class:`~skyward.errors.MissingDependency` that names the extra to
install, instead of a bare ``ModuleNotFoundError`` from deep inside a provider.

>>> paramiko = require("paramiko", "sky.SSH")          # doctest: +SKIP

Guarantees:

1. Nothing is imported until :func:`require` is called: importing this module is free.
2. A package that is installed is returned as ``importlib.import_module`` returns it.
3. A package that another one imports at its own import only for a feature skyward never uses
   (:data:`DEFERRED`) is loaded lazily: it costs nothing until an attribute of it is read.
4. A missing package raises ``MissingDependency`` (a ``SkywardError`` and an ``ImportError``,
   so ``except ImportError`` keeps working) with the package, the feature that needs it and
   the ``pip install`` line; the original error is its ``__cause__``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from types import ModuleType
from typing import Any

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


#: package -> what it imports at its own import only for a rarely used feature: such a module is
#: put in ``sys.modules`` as a stand-in (:class:`_OnFirstUse`) that imports the real one when an
#: attribute of it is first read. paramiko's config parser imports invoke (0.05-0.075 s of CPU
#: in a fresh interpreter here, paid by every command that opens an SSH connection) for ``Match
#: exec`` lines only: a ``~/.ssh/config`` that has one still gets the real invoke when that line
#: is evaluated. (``importlib.util.LazyLoader`` cannot serve: ``import invoke`` itself reads the
#: module's ``__spec__``, which loads it.)
DEFERRED: dict[str, tuple[str, ...]] = {"paramiko": ("invoke",)}

_loading = threading.Lock()


class _OnFirstUse(ModuleType):
    """Stands for a module in ``sys.modules`` until an attribute of it is read (see DEFERRED)."""

    def __getattr__(self, attr: str) -> Any:
        with _loading:
            if sys.modules.get(self.__name__) is self:
                del sys.modules[self.__name__]
            real = importlib.import_module(self.__name__)  # (in sys.modules from now on)
            self.__dict__.update(vars(real))  # (those who hold the stand-in see the real one)
        return getattr(real, attr)


def _defer(name: str) -> None:
    """Make ``import name`` give a stand-in that loads the module when first used (nothing if it
    is loaded already, or not installed: the importing package deals with its absence as before)."""
    spec = None if name in sys.modules else importlib.util.find_spec(name)
    if spec is None:
        return
    stand_in = _OnFirstUse(name)
    stand_in.__spec__ = spec
    sys.modules[name] = stand_in


def require(module: str, feature: str, *, extra: str | None = None) -> ModuleType:
    """Import ``module`` (dotted names allowed) for ``feature``, or say which extra installs it.

    ``feature`` is what the user asked for, in their words ("sky.SSH", "skyward ls");
    ``extra`` overrides the extra named in :data:`EXTRAS` (a package several extras carry).
    Raises :class:`~skyward.errors.MissingDependency` when the package is not installed.
    """
    try:
        top = module.partition(".")[0]
        if top in DEFERRED and top not in sys.modules:
            for name in DEFERRED[top]:
                _defer(name)
        return importlib.import_module(module)
    except ImportError as exc:
        missing = getattr(exc, "name", None) or module
        # Only a missing package of our own list is ours to explain; an ImportError raised
        # inside an installed package (a broken install) is not hidden behind an install hint.
        top = missing.partition(".")[0]
        if top not in EXTRAS:
            raise
        raise MissingDependency(top, feature, extra or EXTRAS[top]) from exc
