"""Secrets: which values are never shown, and the one place that hides them.

A value is secret when

1. it is wrapped in :class:`Secret` (``sky.Secret("...")``), whatever its name; or
2. it is an ``Image.env`` value whose name contains TOKEN, KEY, SECRET, PASS (PASSWORD,
   PASSWD), CREDENTIAL or AUTH, in any case (``db_pass``, ``GITHUB_TOKEN``, ``AUTH_HEADER``); or
3. it is the user-info part of a URL (``https://user:token@host/simple``), in ``pip_indexes``.

Secret values are replaced by ``***`` in reprs, in :class:`~skyward.ConfigError` messages,
in the host-preparation log lines the console shows and :class:`~skyward.BootstrapError`
tails (:class:`Redactor`). On hosts they travel only in files of mode 0600 and in the
environment of the processes that need them, never on a command line (see
:mod:`skyward.bootstrap`). Standard library only: the worker imports this module too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

__all__ = ["MASK", "EnvVars", "Redactor", "Secret", "looks_secret", "mask_url", "url_secrets"]

MASK = "***"
#: Parts of a variable name that make its value secret (PASS covers PASSWORD and PASSWD).
SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASS", "CREDENTIAL", "AUTH")
_URL_USERINFO_RE = re.compile(r"(://)([^/@\s]+)@")


def looks_secret(name: str) -> bool:
    """True when a variable called ``name`` holds a secret by its name alone."""
    upper = name.upper()
    return any(word in upper for word in SECRET_WORDS)


def mask_url(text: str) -> str:
    """``https://user:tok@host/x`` -> ``https://***@host/x``; anything else unchanged."""
    return _URL_USERINFO_RE.sub(r"\1" + MASK + "@", text)


def url_secrets(text: str) -> list[str]:
    """The credentials embedded in URLs in ``text``: the whole user-info and its password."""
    found = []
    for match in _URL_USERINFO_RE.finditer(text):
        userinfo = match.group(2)
        found.append(userinfo)
        _, colon, password = userinfo.partition(":")
        if colon and password:
            found.append(password)
    return found


class Secret:
    """A string that is never shown: ``repr`` and ``str`` give ``***``.

    Wrap any ``Image.env`` value whose name does not already mark it secret::

        image = sky.Image(env={"DATABASE_URL": sky.Secret(url)})

    The environment on the hosts gets the plain value; :meth:`reveal` gives it here. Equal
    (and hashing equal) to another ``Secret`` with the same value.
    """

    __slots__ = ("_value",)

    def __init__(self, value: str):
        if isinstance(value, Secret):
            value = value.reveal()
        if not isinstance(value, str):
            from skyward.errors import ConfigError

            raise ConfigError("Secret", "a string", type(value).__name__)
        self._value = value

    def reveal(self) -> str:
        """The value itself."""
        return self._value

    def __repr__(self) -> str:
        return f"Secret({MASK!r})"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(("skyward.Secret", self._value))

    def __reduce__(self) -> tuple[Any, ...]:
        return (Secret, (self._value,))


class Redactor:
    """Replaces every known secret value in a line of text by ``***``.

    Values shorter than 4 characters are left alone: masking them would mangle ordinary output
    while protecting nothing. Longest values are replaced first (one may contain another).
    """

    __slots__ = ("_values",)

    def __init__(self, values: Iterable[str] = ()):
        self._values = tuple(sorted({v for v in values if len(v) >= 4}, key=len, reverse=True))

    def __bool__(self) -> bool:
        return bool(self._values)

    def __call__(self, text: str) -> str:
        for value in self._values:
            if value in text:
                text = text.replace(value, MASK)
        return text


class EnvVars(Mapping[str, str]):
    """A read-only, hashable ``dict``-like mapping of plain strings whose repr hides secrets.

    Values given as :class:`~skyward.Secret` are stored as their plain string (what the
    hosts' environment gets) and their names remembered as secret, like names that look
    secret (:func:`looks_secret`).
    """

    __slots__ = ("_items", "_marked")

    def __init__(self, items: Iterable[tuple[str, str | Secret]] = ()):
        plain: dict[str, str] = {}
        marked = set()
        for key, value in sorted(items, key=lambda kv: kv[0]):
            if isinstance(value, Secret):
                marked.add(key)
                value = value.reveal()
            plain[key] = value
        self._items = plain
        self._marked = frozenset(marked)

    def is_secret(self, key: str) -> bool:
        """True when the value of ``key`` is never shown."""
        return key in self._marked or looks_secret(key)

    def marked(self) -> dict[str, str | Secret]:
        """The variables, with every secret value wrapped in :class:`~skyward.Secret`."""
        return {k: (Secret(v) if self.is_secret(k) else v) for k, v in self._items.items()}

    def __getitem__(self, key: str) -> str:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(tuple(self._items.items()))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self._items == dict(other.items())
        return NotImplemented

    def __reduce__(self) -> tuple[Any, ...]:
        return (EnvVars, (tuple(self.marked().items()),))

    def __repr__(self) -> str:
        shown = {k: (MASK if self.is_secret(k) else v) for k, v in self._items.items()}
        return repr(shown)
