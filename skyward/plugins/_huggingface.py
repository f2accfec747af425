"""``sky.plugins.huggingface``: install the Hugging Face libraries and hand every node your token.

Two hooks:

* ``transform`` (client): appends ``packages`` (by default ``transformers``, ``datasets``,
  ``tokenizers``) to the image's pip packages and, when a token is given, sets ``HF_TOKEN``
  in the image's env. The image shows it as ``***`` in its repr, and the bootstrap keeps it
  in a file only the owner can read.
* ``around_app`` (worker, once per worker process): exports ``HF_TOKEN`` and its older name
  ``HUGGING_FACE_HUB_TOKEN``, which ``huggingface_hub`` (and so ``transformers`` and
  ``datasets``) read for every download and upload. No ``huggingface-cli login`` is run:
  that would put the token on a command line and in a file on the machine.

The token is held by a :class:`Token`, whose ``repr``/``str`` is ``Token('***')``: the plugin's
repr, errors and logs never show it. Nothing from Hugging Face is imported by this module.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from skyward.errors import ConfigError
from skyward.plugins._base import PoolInfo, Plugin
from skyward.plugins._jax import exported_env

if TYPE_CHECKING:
    from skyward.image import Image
    from skyward.runtime import InstanceInfo

__all__ = ["DEFAULT_PACKAGES", "Token", "huggingface"]

#: What ``packages`` installs unless told otherwise.
DEFAULT_PACKAGES: tuple[str, ...] = ("transformers", "datasets", "tokenizers")
#: The variables huggingface_hub reads the token from (current name first).
TOKEN_VARS: tuple[str, ...] = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


class Token:
    """A secret string that never shows itself: ``repr`` and ``str`` are ``Token('***')``.

    :meth:`reveal` returns the value. It pickles with its value (the worker needs it), so
    treat a pickled plugin as secret, as the pool's private channel to its workers does.
    """

    __slots__ = ("_value",)

    def __init__(self, value: str):
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Token('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Token) and other._value == self._value

    def __hash__(self) -> int:
        return hash((Token, self._value))

    def __reduce__(self):
        return (Token, (self._value,))


def _transform(image: Image, cluster: PoolInfo, *, token: Token | None, packages: tuple[str, ...]) -> Image:
    image = image.with_pip(*packages) if packages else image
    if token is not None:
        image = image.with_env({TOKEN_VARS[0]: token.reveal()})
    return image


@contextlib.contextmanager
def _export_token(info: InstanceInfo, *, token: Token | None) -> Iterator[None]:
    if token is None:
        yield
        return
    value = token.reveal()
    with exported_env({name: value for name in TOKEN_VARS}):
        yield


def _check_packages(packages: object) -> tuple[str, ...]:
    accepted = 'a list of pip requirement strings, e.g. ["transformers", "datasets"]'
    if isinstance(packages, (str, bytes)) or not isinstance(packages, Sequence):
        raise ConfigError("packages", accepted, packages)
    out: dict[str, None] = {}
    for item in packages:
        if not isinstance(item, str) or not item.strip():
            raise ConfigError("packages", accepted, item)
        out.setdefault(item.strip(), None)
    return tuple(out)


def huggingface(token: str | None = None, packages: Sequence[str] = DEFAULT_PACKAGES) -> Plugin:
    """The Hugging Face libraries on every node, logged in with ``token``.

    Args:
        token: a Hugging Face access token (``hf_...``), for private or gated models and
            datasets and for uploads; None for public ones only. Surrounding whitespace is
            stripped. It never appears in reprs, errors or logs.
        packages: pip requirements to install; ``()`` installs nothing (token only).

    Raises:
        ConfigError: for an invalid argument, when the plugin is made (naming the token's
            type, never its value).

    For several nodes, combine with ``sky.plugins.torch()``: ``transformers.Trainer`` picks
    up the process group it starts.

    >>> import skyward as sky
    >>> sky.plugins.huggingface(token="hf_example")  # doctest: +ELLIPSIS
    Plugin(name='huggingface', transform=functools.partial(<function _transform at ...>, token=Token('***'), ...
    """
    if token is not None:
        if not isinstance(token, str) or not token.strip():
            # Never echo the value: it may be a secret of the wrong type (bytes, a SecretStr...).
            shown = "an empty string" if isinstance(token, str) else f"a {type(token).__name__}"
            raise ConfigError("token", "a non-empty string (a Hugging Face access token) or None", shown)
        held: Token | None = Token(token.strip())
    else:
        held = None
    checked = _check_packages(packages)
    return Plugin(
        "huggingface",
        transform=functools.partial(_transform, token=held, packages=checked),
        around_app=functools.partial(_export_token, token=held),
    )
