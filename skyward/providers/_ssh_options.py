"""The options of :class:`~skyward.SSH`, checked by one pydantic model when the provider is made.

Host entries are split here (``"user@host:port"``, ``"[v6]:port"``, a bare IPv6 address);
:class:`~skyward.SSH` then completes each one from its own arguments and ``~/.ssh/config``.
Imported on first use (it imports pydantic, see :mod:`skyward._config`).
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, Field

from skyward._config import STRICT, Flag, Seconds, reject, strings, validate

__all__ = ["SSHOptions", "split_host", "ssh_options"]

_HOST_ENTRY = 'entries like "host", "user@host" or "user@host:port"'
_DIST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_BAD_NAME_CHARS = frozenset(" \t\r\n@[]/\\")


def split_host(entry: str) -> tuple[str | None, str, int | None]:
    """``"user@host:port"`` -> (user, host, port); user and port may be absent (None).

    IPv6 addresses go in brackets when a port follows (``"[fe80::1]:22"``) and may be bare
    otherwise (``"fe80::1"``). Anything else rejects the entry.
    """
    user: str | None
    user, at, rest = entry.rpartition("@")
    if not at:
        user = None
    elif not user or any(c in _BAD_NAME_CHARS for c in user):
        reject(_HOST_ENTRY, entry)
    port = ""
    if rest.startswith("["):  # [v6] or [v6]:port
        host, closed, tail = rest[1:].partition("]")
        if not closed or (tail and not tail.startswith(":")):
            reject(_HOST_ENTRY, entry)
        port = tail[1:] if tail else ""
        _ipv6(host, entry)
    elif rest.count(":") > 1:  # a bare IPv6 address: no port possible
        host = rest
        _ipv6(host, entry)
    else:
        host, colon, port = rest.partition(":")
        if not host or any(c in _BAD_NAME_CHARS for c in host) or (colon and not port):
            reject(_HOST_ENTRY, entry)
    if not port:
        return user, host, None
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        reject("ports between 1 and 65535", entry)
    return user, host, int(port)


def _ipv6(text: str, entry: str) -> None:
    try:
        ipaddress.IPv6Address(text)  # takes a %scope too
    except ValueError:
        reject(_HOST_ENTRY + ' (IPv6 as "[fe80::1]:22")', entry)


def _some(hosts: tuple[tuple[str | None, str, int | None], ...]) -> Any:
    if not hosts:
        reject("at least one host", [])
    return hosts


def _user(value: str | None) -> str | None:
    if value is not None and (not value.strip() or "@" in value):
        reject("a login user name", value)
    return value


def _root(value: str) -> str:
    if not (value.startswith("/") or value == "~" or value.startswith("~/")):
        reject("an absolute path or one starting with ~/", value)
    return value.rstrip("/") or "/"


def _one_or_many(value: Any) -> Any:
    import os

    return [value] if isinstance(value, (str, os.PathLike)) else value


def _site_packages(value: Any) -> bool | tuple[str, ...]:
    accepted = 'True, False, or a list of distribution names like ["torch"]'
    if isinstance(value, bool):
        return value
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        reject(accepted, value)
    for name in value:
        if not isinstance(name, str) or not _DIST_RE.match(name.strip()):
            reject("distribution names like 'torch'", name)
    return tuple(n.strip() for n in value) or False


Hosts = Annotated[
    strings('a list of hosts like "host", "user@host" or "user@host:port"', each=_HOST_ENTRY, check=split_host),
    AfterValidator(lambda entries: tuple(split_host(e) for e in entries)),
    AfterValidator(_some),
]
User = Annotated[str | None, AfterValidator(_user), Field(description="a login user name")]
Port = Annotated[int | None, Field(ge=1, le=65535, description="an integer between 1 and 65535")]
KnownHosts = Annotated[strings("known_hosts file paths", paths=True) | None, BeforeValidator(_one_or_many)]
Root = Annotated[str, AfterValidator(_root), Field(description="an absolute path or one starting with ~/")]
Addresses = strings("a list of addresses, one per host")
FindLinks = strings("a list of directories on the hosts or URLs", paths=True)
SitePackages = Annotated[Any, AfterValidator(_site_packages)]


class SSHOptions(BaseModel):
    """``sky.SSH(...)``'s arguments, checked one by one (cross-checks are the provider's)."""

    model_config = STRICT

    hosts: Hosts
    user: User = None
    port: Port = None
    known_hosts: KnownHosts = None
    verify_host_keys: Flag = True
    root: Root = "~/.skyward"
    connect_timeout: Seconds = 10.0
    private_addrs: Addresses | None = None
    find_links: FindLinks = ()
    no_index: Flag = False
    system_site_packages: SitePackages = False
    bootstrap_timeout: Seconds = 1800.0


def ssh_options(**values: Any) -> SSHOptions:
    """Validate ``sky.SSH``'s keyword arguments; raises ConfigError for the first bad one."""
    return validate(SSHOptions, values)
