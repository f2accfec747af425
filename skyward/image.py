"""``Image``: what a machine needs before it can run your functions.

An ``Image`` is a frozen value describing the Python environment every node of a pool runs
in: the Python version, pip packages and indexes, apt packages, environment variables, setup
commands, and local files to ship along. It is turned into a bootstrap script by
:func:`skyward.bootstrap.render`.

Guarantees:

1. An ``Image`` never changes. ``with_pip``, ``with_apt``, ``with_env``, ``with_setup``,
   ``with_include`` and ``replace`` return a new image; appending keeps what was already
   there, in order, and drops exact duplicates (the first occurrence wins).
2. Invalid input raises :class:`~skyward.errors.ConfigError` naming the parameter, when the
   image is built — before anything is provisioned. ``include`` paths are checked to exist on
   this machine at that moment, too.
3. :meth:`Image.content_hash` is stable across processes and machines and changes whenever
   anything that affects the built environment changes (not ``include``, which is synced on
   every start; :meth:`Image.include_hash` tracks that).
4. ``repr(image)`` never shows a secret: an ``env`` value wrapped in :class:`~skyward.Secret`
   or whose name contains TOKEN, KEY, SECRET, PASS, CREDENTIAL or AUTH (any case), nor
   credentials embedded in URLs (see :mod:`skyward._secrets`). :meth:`Image.secrets` lists
   them, so that logs can be cleaned of them.

Example::

    image = sky.Image(pip=["numpy"], env={"HF_TOKEN": token, "DATABASE_URL": sky.Secret(url)})
    image = image.with_pip("torch", index="https://download.pytorch.org/whl/cpu")
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skyward._secrets import EnvVars, Secret, url_secrets
from skyward._secrets import looks_secret as _looks_secret
from skyward._secrets import mask_url as _mask_url
from skyward.errors import ConfigError

__all__ = ["Image"]

# Bump when the meaning of a field, or the layout of a built environment, changes, so that
# environments built under the old meaning are not reused as warm. 2: the image's env lives
# in a per-pool file (bootstrap's env_file), no longer in the environment's .skyward-env,
# which a client of format 1 needs on a warm start.
_HASH_FORMAT = 2

# Build artefacts that change without their sources changing.
_SKIP_DIRS = frozenset({"__pycache__", ".git", ".mypy_cache", ".pytest_cache"})
_SKIP_SUFFIXES = (".pyc", ".pyo")


@dataclass(frozen=True, slots=True)
class Image:
    """The environment every node of a pool runs in. See the module docstring.

    Args:
        python: ``"auto"`` (this client's ``major.minor``) or a version like ``"3.12"``.
        pip: requirement strings installed with ``uv pip install`` (``"numpy>=1.26"``).
        pip_indexes: extra package indexes (``http(s)://`` or ``file://`` URLs).
        apt: Debian/Ubuntu packages installed with ``apt-get`` (needs root or sudo).
        env: environment variables for setup commands and for the worker; wrap a value in
            :class:`~skyward.Secret` to keep it out of reprs, errors and logs (names with
            TOKEN, KEY, SECRET, PASS, CREDENTIAL or AUTH are kept out already).
        setup: shell commands run once when the environment is first built, in order.
        include: local files or directories shipped to every node on every start.

    Raises:
        ConfigError: naming the parameter, for any invalid field.
    """

    python: str = "auto"
    pip: tuple[str, ...] = ()
    pip_indexes: tuple[str, ...] = ()
    apt: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    setup: tuple[str, ...] = ()
    include: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self._is_default():  # (nothing to check: pydantic, ~0.15 s to import, stays unloaded)
            object.__setattr__(self, "env", EnvVars(()))
            return
        from skyward._image_fields import check_fields  # pydantic: loaded on first use

        checked = check_fields({f.name: getattr(self, f.name) for f in dataclasses.fields(self)})
        for name, value in checked.items():
            object.__setattr__(self, name, value)  # frozen: normalise once, here

    def _is_default(self) -> bool:
        """Every field is its default as given (``Image()``, what a pool without one runs): what
        the checks would return is known."""
        return (self.python == "auto" and type(self.python) is str and type(self.env) is dict and not self.env
                and all(type(v) is tuple and not v for v in (self.pip, self.pip_indexes, self.apt, self.setup,
                                                            self.include)))

    # -- reading -------------------------------------------------------------------------

    @property
    def resolved_python(self) -> str:
        """The Python version to build, with ``"auto"`` replaced by this client's major.minor."""
        if self.python == "auto":
            return f"{sys.version_info.major}.{sys.version_info.minor}"
        return self.python

    def secrets(self) -> tuple[str, ...]:
        """Every secret value this image holds: secret ``env`` values and URL credentials."""
        env = self.env
        found = [v for k, v in env.items() if (env.is_secret(k) if isinstance(env, EnvVars) else _looks_secret(k))]
        for url in self.pip_indexes:
            found += url_secrets(url)
        return tuple(dict.fromkeys(v for v in found if v))

    def content_hash(self) -> str:
        """16 hex digits identifying the built environment (everything except ``include``)."""
        payload = {
            "v": _HASH_FORMAT,
            "python": self.resolved_python,
            "pip": list(self.pip),
            "pip_indexes": list(self.pip_indexes),
            "apt": list(self.apt),
            "env": sorted(self.env.items()),
            "setup": list(self.setup),
        }
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def include_hash(self) -> str:
        """16 hex digits over the included files' relative paths and bytes.

        Paths are taken relative to each include's parent directory, so the digest does not
        depend on where the project is checked out. ``__pycache__``, ``.git`` and ``*.pyc``
        are ignored.

        Raises:
            ConfigError: an include path no longer exists.
        """
        digest = hashlib.sha256()
        for root in self.include:
            for rel, path in _included_files(Path(root)):
                data = path.read_bytes()
                for chunk in (rel.encode("utf-8", "surrogateescape"), data):
                    digest.update(len(chunk).to_bytes(8, "big"))
                    digest.update(chunk)
        return digest.hexdigest()[:16]

    # -- changing (always a new image) -----------------------------------------------------

    def replace(self, **changes: Any) -> Image:
        """A copy with the given fields replaced (and validated again)."""
        names = {f.name for f in dataclasses.fields(self)}
        for name in changes:
            if name not in names:
                raise ConfigError("replace", "one of " + ", ".join(sorted(names)), name)
        return dataclasses.replace(self, **changes)

    def with_pip(self, *packages: str, index: str | None = None) -> Image:
        """A copy with ``packages`` appended to ``pip`` and ``index`` (if any) to ``pip_indexes``."""
        indexes = self.pip_indexes + ((index,) if index is not None else ())
        return self.replace(pip=self.pip + packages, pip_indexes=indexes)

    def with_apt(self, *packages: str) -> Image:
        """A copy with ``packages`` appended to ``apt``."""
        return self.replace(apt=self.apt + packages)

    def with_env(self, env: Mapping[str, str | Secret] | None = None, /, **values: str | Secret) -> Image:
        """A copy with these variables set; a name already present takes the new value."""
        merged: dict[str, str | Secret] = self.env.marked() if isinstance(self.env, EnvVars) else dict(self.env)
        merged.update(env or {})
        merged.update(values)
        return self.replace(env=merged)

    def with_setup(self, *commands: str) -> Image:
        """A copy with ``commands`` appended to ``setup``."""
        return self.replace(setup=self.setup + commands)

    def with_include(self, *paths: str | os.PathLike[str]) -> Image:
        """A copy with ``paths`` appended to ``include`` (they must exist)."""
        return self.replace(include=self.include + tuple(os.fspath(p) for p in paths))

    def __repr__(self) -> str:
        shown = [f"python={self.python!r}"]
        for name in ("pip", "pip_indexes", "apt", "env", "setup", "include"):
            value = getattr(self, name)
            if not value:
                continue
            if name in ("pip", "pip_indexes"):
                value = tuple(_mask_url(v) for v in value)
            shown.append(f"{name}={value!r}")
        return "Image(" + ", ".join(shown) + ")"


def _included_files(root: Path) -> Iterator[tuple[str, Path]]:
    if not root.exists():
        raise ConfigError("include", "existing local paths", str(root), detail="it was removed")
    if root.is_file():
        yield root.name, root
        return
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for name in sorted(filenames):
            path = Path(dirpath, name)
            if name.endswith(_SKIP_SUFFIXES) or not path.is_file():  # also skips broken links
                continue
            yield path.relative_to(root.parent).as_posix(), path
