"""The SSH provider: machines you already have, reached over SSH.

Each host given to :class:`SSH` is one node. The provider only describes the hosts (how to
reach each, where its environments live); the pool connects to every host (one SSH connection
each), prepares it (:mod:`skyward.pool.prepare`) and starts the worker over the same
connection. Nothing is bought, so nothing is released afterwards — but no skyward process is
left running on any host (see :mod:`skyward.transport.ssh`).

paramiko is imported only when a pool actually connects.
"""

from __future__ import annotations

import getpass
import os
import re
from collections.abc import Iterable, Sequence
from typing import Any

from skyward.errors import ConfigError
from skyward.providers.base import HostEnvironment, Instance, PoolSpec, Provider, SSHAddress

__all__ = ["SSH"]

_HOST_RE = re.compile(r"^(?:(?P<user>[^@\s]+)@)?(?:\[(?P<v6>[0-9A-Fa-f:.%\w]+)\]|(?P<name>[^@\s:\[\]]+))(?::(?P<port>\d+))?$")
_DIST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _parse_host(spec: str) -> tuple[str | None, str, int | None]:
    """``"user@host:port"`` -> (user, host, port); user and port are optional; IPv6 in brackets."""
    text = spec.strip()
    if text.count(":") > 1 and "[" not in text and "@" not in text:
        return None, text, None  # a bare IPv6 address
    m = _HOST_RE.match(text)
    if not m:
        raise ConfigError("hosts", 'entries like "host", "user@host" or "user@host:port"', spec)
    port = int(m["port"]) if m["port"] else None
    if port is not None and not 1 <= port <= 65535:
        raise ConfigError("hosts", "ports between 1 and 65535", spec)
    return m["user"], m["v6"] or m["name"], port


def _strings(parameter: str, value: Any, accepted: str) -> tuple[str, ...]:
    if isinstance(value, (str, bytes, os.PathLike)) or not isinstance(value, Iterable):
        hint = f"pass a list, e.g. [{os.fspath(value)!r}]" if isinstance(value, (str, os.PathLike)) else ""
        raise ConfigError(parameter, accepted, value, detail=hint)
    out = []
    for item in value:
        if not isinstance(item, (str, os.PathLike)) or not os.fspath(item).strip():
            raise ConfigError(parameter, accepted, item)
        out.append(os.fspath(item).strip())
    return tuple(out)


def key_file(parameter: str, value: object) -> str:
    """The expanded path of an existing private key file, or ConfigError naming ``parameter``."""
    if not isinstance(value, (str, os.PathLike)):
        raise ConfigError(parameter, "the path of a private key file", value)
    path = os.path.expanduser(os.fspath(value))
    if not os.path.isfile(path):
        raise ConfigError(parameter, "the path of a private key file", os.fspath(value), detail="not found")
    return path

class SSH(Provider):
    """Use machines you can reach over SSH; one node per host.

    >>> import skyward as sky
    >>> ssh = sky.SSH(hosts=["gpu1", "ubuntu@10.0.0.12:2222"], key="~/.ssh/lab")
    >>> with sky.ComputePool(provider=ssh, nodes=2, image=sky.Image(pip=["numpy"])) as pool:  # doctest: +SKIP
    ...     ...

    Args:
        hosts: one entry per node: ``"host"``, ``"user@host"``, ``"host:port"`` or
            ``"user@host:port"`` (IPv6 in brackets: ``"[fe80::1]:22"``).
        user: login user for hosts that don't name one (default: your local user name).
        key: a private key file. When given, only this key is offered; when None, the SSH
            agent's keys and ``~/.ssh/id_*`` are tried.
        port: SSH port for hosts that don't name one.
        known_hosts: known_hosts file(s) to check host keys against (default
            ``~/.ssh/known_hosts`` and ``/etc/ssh/ssh_known_hosts``).
        verify_host_keys: True (default) refuses a host whose key is unknown or changed.
            False accepts any key — only for throw-away machines on a network you trust.
        root: directory on each host for environments, wheels and scripts (absolute, or
            starting with ``~/``).
        connect_timeout: seconds for connecting and authenticating.
        private_addrs: the address each host has for the *other* hosts (``head_addr`` and
            ``peers``), when that differs from the address you connect to (e.g. a public
            name vs. a private network). Default: the host address as given.
        find_links: wheel directories (paths on the hosts) or URLs that pip/uv search, for
            offline installs or a local wheelhouse; used for uv itself too.
        no_index: with ``find_links``, use nothing but them (no package index at all).
        system_site_packages: True lets the environment see the host Python's own packages;
            a list of distribution names (e.g. ``["torch"]``) does that and also takes those
            packages from the host instead of installing them (a preinstalled CUDA torch).
        bootstrap_timeout: seconds a host's environment build may take.

    Raises:
        ConfigError: for any invalid argument, when the provider is made.
    """

    name = "ssh"

    def __init__(
        self,
        hosts: Sequence[str],
        *,
        user: str | None = None,
        key: str | os.PathLike[str] | None = None,
        port: int = 22,
        known_hosts: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None,
        verify_host_keys: bool = True,
        root: str = "~/.skyward",
        connect_timeout: float = 10.0,
        private_addrs: Sequence[str] | None = None,
        find_links: Sequence[str] = (),
        no_index: bool = False,
        system_site_packages: bool | Sequence[str] = False,
        bootstrap_timeout: float = 1800.0,
    ):
        entries = _strings("hosts", hosts, 'a list of hosts like "host", "user@host" or "user@host:port"')
        if not entries:
            raise ConfigError("hosts", "at least one host", list(hosts))
        if user is not None and (not isinstance(user, str) or not user.strip() or "@" in user):
            raise ConfigError("user", "a login user name", user)
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise ConfigError("port", "an integer between 1 and 65535", port)
        if user is None:
            try:
                user = getpass.getuser()
            except (OSError, KeyError) as exc:  # no name for this uid (some containers)
                raise ConfigError("user", "a login user name (this machine's user name is unknown)", None) from exc
        default_user = user
        self.hosts: tuple[tuple[str, str, int], ...] = tuple(
            (u or default_user, h, p or port) for u, h, p in map(_parse_host, entries)
        )
        self.key = None if key is None else key_file("key", key)
        if not isinstance(verify_host_keys, bool):
            raise ConfigError("verify_host_keys", "True or False", verify_host_keys)
        self.verify_host_keys = verify_host_keys
        self.known_hosts: tuple[str, ...]
        if known_hosts is None:
            self.known_hosts = (os.path.expanduser("~/.ssh/known_hosts"), "/etc/ssh/ssh_known_hosts")
        else:
            given = (known_hosts,) if isinstance(known_hosts, (str, os.PathLike)) else known_hosts
            files = tuple(os.path.expanduser(p) for p in _strings("known_hosts", given, "known_hosts file paths"))
            if verify_host_keys:
                for path in files:
                    if not os.path.isfile(path):
                        raise ConfigError("known_hosts", "existing known_hosts files", path, detail="not found")
            self.known_hosts = files
        if not isinstance(root, str) or not (root.startswith("/") or root == "~" or root.startswith("~/")):
            raise ConfigError("root", "an absolute path or one starting with ~/", root)
        self.root = root.rstrip("/") or "/"
        for name, value in (("connect_timeout", connect_timeout), ("bootstrap_timeout", bootstrap_timeout)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(name, "a positive number of seconds", value)
        self.connect_timeout = float(connect_timeout)
        self.bootstrap_timeout = float(bootstrap_timeout)
        if private_addrs is None:
            self.private_addrs = tuple(h for _, h, _ in self.hosts)
        else:
            self.private_addrs = _strings("private_addrs", private_addrs, "a list of addresses, one per host")
            if len(self.private_addrs) != len(self.hosts):
                raise ConfigError("private_addrs", f"{len(self.hosts)} addresses (one per host)",
                                  list(self.private_addrs))
        self.find_links = _strings("find_links", find_links, "a list of directories on the hosts or URLs")
        if not isinstance(no_index, bool):
            raise ConfigError("no_index", "True or False", no_index)
        self.no_index = no_index
        if isinstance(system_site_packages, bool):
            self.system_site_packages: bool | tuple[str, ...] = system_site_packages
        else:
            names = _strings("system_site_packages", system_site_packages,
                             'True, False, or a list of distribution names like ["torch"]')
            for n in names:
                if not _DIST_RE.match(n):
                    raise ConfigError("system_site_packages", "distribution names like 'torch'", n)
            self.system_site_packages = names or False

    # -- the provider contract --------------------------------------------------------------------
    def validate(self, spec: PoolSpec) -> None:
        if spec.nodes != len(self.hosts):
            raise ConfigError("nodes", f"{len(self.hosts)} (one node per host given to sky.SSH)", spec.nodes)

    def provision(self, spec: PoolSpec) -> list[Instance]:
        self.validate(spec)
        count = getattr(spec.accelerator, "count", 0) if spec.accelerator is not None else 0
        environment = HostEnvironment(root=self.root, find_links=self.find_links, no_index=self.no_index,
                                      system_site_packages=self.system_site_packages,
                                      bootstrap_timeout=self.bootstrap_timeout)
        return [
            Instance(id=f"ssh:{u}@{h}:{p}", node=i, private_addr=self.private_addrs[i], public_addr=h,
                     accelerators=count, environment=environment,
                     ssh=SSHAddress(h, u, p, key=self.key, known_hosts=self.known_hosts,
                                    verify_host_keys=self.verify_host_keys, connect_timeout=self.connect_timeout))
            for i, (u, h, p) in enumerate(self.hosts)
        ]

    def terminate(self, instances: list[Instance]) -> None:
        # The hosts are yours: nothing to release. The pool has already stopped every worker
        # and confirmed its process group gone, and closed the connections.
        return None

    def __repr__(self) -> str:
        shown = [f"{u}@{h}" + (f":{p}" if p != 22 else "") for u, h, p in self.hosts]
        return f"SSH(hosts={shown!r})"
