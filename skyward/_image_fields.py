"""The checks behind :class:`~skyward.Image`: one pydantic model over its fields.

``Image.__post_init__`` calls :func:`check_fields` with the raw values and stores the
normalised ones (tuples without duplicates, a read-only ``env``, resolved ``include`` paths).
Imported on first use (it imports pydantic, see :mod:`skyward._config`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, Field

from skyward._config import STRICT, reject, strings, validate
from skyward._secrets import MASK, EnvVars, Secret, looks_secret, mask_url

__all__ = ["check_fields"]

_PYTHON_RE = re.compile(r"^3\.\d{1,2}(\.\d{1,3})?$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Debian package names (policy 5.6.1), optionally with :arch and =version.
_APT_RE = re.compile(r"^[a-z0-9][a-z0-9+.\-]*(:[a-z0-9\-]+)?(=[A-Za-z0-9.+~:\-]+)?$")


def _python(value: str) -> str:
    if not (value == "auto" or _PYTHON_RE.match(value)):
        reject('"auto" or a version string like "3.12"', value)
    return value


def _requirement(text: str) -> None:
    if text.startswith("-"):
        reject("requirement strings, not pip options", text, detail="use pip_indexes for indexes")


def _index_url(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https", "file") or (parts.scheme != "file" and not parts.netloc):
        reject("http(s):// or file:// URLs", mask_url(url))
    if any(c.isspace() for c in url):
        reject("http(s):// or file:// URLs without spaces", mask_url(url))


def _apt(name: str) -> None:
    if not _APT_RE.match(name):
        reject("Debian package names like 'ffmpeg' or 'libgl1=1.7.0-1'", name)


def _env(env: Any) -> EnvVars:
    if not isinstance(env, Mapping):
        reject("a mapping of variable names to string values", type(env).__name__)
    if isinstance(env, EnvVars):
        return env
    for key, value in env.items():
        if not isinstance(key, str) or not _ENV_NAME_RE.match(key):
            reject("variable names matching [A-Za-z_][A-Za-z0-9_]*", key)
        secret = isinstance(value, Secret) or looks_secret(key)
        text = value.reveal() if isinstance(value, Secret) else value
        if not isinstance(text, str):
            reject("string values (or sky.Secret values)", MASK if secret else value, detail=f"for {key}")
        if "\0" in text:  # no environment can hold it: the build would fail on the host
            reject("string values without NUL characters", MASK if secret else text, detail=f"for {key}")
    return EnvVars(env.items())


def _exists(path: str) -> None:
    if not Path(path).expanduser().exists():
        reject("existing local paths", path, detail="not found on this machine")


def _resolved(paths: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(str(Path(p).expanduser().resolve()) for p in paths))


Python = Annotated[str, AfterValidator(_python), Field(description='"auto" or a version string like "3.12"')]
Requirements = strings("a list of requirement strings", each="requirement strings", check=_requirement, unique=True)
IndexURLs = strings("a list of http(s):// or file:// URLs", check=_index_url, unique=True)
AptPackages = strings("a list of Debian package names", check=_apt, unique=True)
Env = Annotated[Any, AfterValidator(_env),
                Field(description="a mapping of variable names to string (or sky.Secret) values")]
Commands = strings("a list of shell commands", unique=True)
Includes = Annotated[strings("a list of existing local paths", each="existing local paths", check=_exists, paths=True),
                     AfterValidator(_resolved)]


class ImageFields(BaseModel):
    model_config = STRICT

    python: Python
    pip: Requirements
    pip_indexes: IndexURLs
    apt: AptPackages
    env: Env
    setup: Commands
    include: Includes


def check_fields(values: dict[str, Any]) -> dict[str, Any]:
    """The validated, normalised fields; ConfigError naming the first bad one."""
    return dict(validate(ImageFields, values))

