"""The SSH provider: machines you already have, reached over SSH.

Each host given to :class:`SSH` is one node. The provider only describes the hosts (how to
reach each, where its environments live); the pool connects to every host (one SSH connection
each), prepares it (:mod:`skyward.pool.prepare`) and starts the worker over the same
connection. Nothing is bought, so nothing is released afterwards — but no skyward process is
left running on any host (see :mod:`skyward.transport.ssh`).

paramiko is imported when an ``SSH`` provider is made (it reads ``~/.ssh/config``), never by
``import skyward``.
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from skyward._optional import require
from skyward.errors import ConfigError
from skyward.providers.base import HostEnvironment, Instance, PoolSpec, Provider, SSHAddress

__all__ = ["SSH"]



def key_file(parameter: str, value: object) -> str:
    """The expanded path of an existing private key file, or ConfigError naming ``parameter``."""
    if not isinstance(value, (str, os.PathLike)):
        raise ConfigError(parameter, "the path of a private key file", value)
    path = os.path.expanduser(os.fspath(value))
    if not os.path.isfile(path):
        raise ConfigError(parameter, "the path of a private key file", os.fspath(value), detail="not found")
    return path

def _ssh_config() -> Any:
    """``~/.ssh/config`` as paramiko reads it (empty when there is none); paramiko is needed here."""
    paramiko = require("paramiko", "sky.SSH")
    try:
        text = Path(os.path.expanduser("~/.ssh/config")).read_text(errors="replace")
    except OSError:
        text = ""
    return paramiko.SSHConfig.from_text(text)


def _config_key(files: list[str] | None) -> str | None:
    """The first ``IdentityFile`` of a host's ``~/.ssh/config`` entry that exists. Like ssh,
    files that do not exist are skipped (a ``Host *`` default often names several)."""
    for path in (os.path.expanduser(f) for f in files or ()):
        if os.path.isfile(path):
            return path
    return None


def _config_port(value: str | None, host: str) -> int | None:
    if value is None:
        return None
    if not value.isdigit() or not 1 <= int(value) <= 65535:
        raise ConfigError("hosts", "ports between 1 and 65535", host, detail=f"Port {value} in ~/.ssh/config")
    return int(value)


class SSH(Provider):
    """Use machines you can reach over SSH; one node per host.

    >>> import skyward as sky
    >>> ssh = sky.SSH(hosts=["gpu1", "ubuntu@10.0.0.12:2222"], key="~/.ssh/lab")
    >>> with sky.ComputePool(provider=ssh, nodes=2, image=sky.Image(pip=["numpy"])) as pool:  # doctest: +SKIP
    ...     ...

    Args:
        hosts: one entry per node: ``"host"``, ``"user@host"``, ``"host:port"`` or
            ``"user@host:port"`` (IPv6 in brackets: ``"[fe80::1]:22"``). A name that
            ``~/.ssh/config`` knows takes its ``HostName``, ``User``, ``Port``,
            ``IdentityFile``, ``ProxyJump`` and ``ProxyCommand`` from there (what the entry or
            ``user``/``port``/``key`` say wins), so it is reached as ``ssh host`` would.
        user: login user for hosts that don't name one (default: ``~/.ssh/config``'s ``User``
            for the host, else your local user name).
        key: a private key file. When given, only this key is offered; when None, the host's
            ``IdentityFile`` from ``~/.ssh/config``, else the SSH agent's keys and
            ``~/.ssh/id_*`` are tried.
        port: SSH port for hosts that don't name one (default: ``~/.ssh/config``'s, else 22).
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
        port: int | None = None,
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
        from skyward.providers._ssh_options import ssh_options

        o = ssh_options(hosts=hosts, user=user, port=port, known_hosts=known_hosts, verify_host_keys=verify_host_keys,
                        root=root, connect_timeout=connect_timeout, private_addrs=private_addrs,
                        find_links=find_links, no_index=no_index, system_site_packages=system_site_packages,
                        bootstrap_timeout=bootstrap_timeout)
        config = _ssh_config()
        default_user = o.user
        if default_user is None:
            try:
                default_user = getpass.getuser()
            except (OSError, KeyError) as exc:  # no name for this uid (some containers)
                raise ConfigError("user", "a login user name (this machine's user name is unknown)", None) from exc
        hosts_: list[tuple[str, str, int]] = []
        keys: list[str | None] = []
        jumps: list[str] = []
        proxies: list[str | None] = []  # ProxyCommand, with %h %p %r already expanded by paramiko
        for entry_user, name, entry_port in o.hosts:
            # As with `ssh -l user -p port name`: what the entry or the arguments say wins over
            # ~/.ssh/config, which wins over the defaults (your user name, port 22).
            found = config.lookup(name)
            login = entry_user or o.user or found.get("user") or default_user
            number = entry_port or o.port or _config_port(found.get("port"), name) or 22
            hosts_.append((login, found.get("hostname", name), number))
            keys.append(_config_key(found.get("identityfile")) if key is None else None)
            jumps.append(found.get("proxyjump", ""))
            proxies.append(found.get("proxycommand"))
        self.hosts: tuple[tuple[str, str, int], ...] = tuple(hosts_)
        self.key = None if key is None else key_file("key", key)
        # Per host: the key given to SSH(key=...), else the host's IdentityFile in ~/.ssh/config,
        # else None (the agent's keys and ~/.ssh/id_*).
        self.keys: tuple[str | None, ...] = tuple(self.key or k for k in keys)
        self.verify_host_keys = o.verify_host_keys
        self.known_hosts: tuple[str, ...]
        if o.known_hosts is None:
            self.known_hosts = (os.path.expanduser("~/.ssh/known_hosts"), "/etc/ssh/ssh_known_hosts")
        else:
            self.known_hosts = tuple(os.path.expanduser(p) for p in o.known_hosts)
            for path in self.known_hosts if self.verify_host_keys else ():
                if not os.path.isfile(path):
                    raise ConfigError("known_hosts", "existing known_hosts files", path, detail="not found")
        self.root = o.root
        self.connect_timeout = o.connect_timeout
        self.bootstrap_timeout = o.bootstrap_timeout
        self.private_addrs = o.private_addrs or tuple(h for _, h, _ in self.hosts)
        if len(self.private_addrs) != len(self.hosts):
            raise ConfigError("private_addrs", f"{len(self.hosts)} addresses (one per host)", list(self.private_addrs))
        self.find_links = o.find_links
        self.no_index = o.no_index
        self.system_site_packages: bool | tuple[str, ...] = o.system_site_packages
        # ProxyJump from ~/.ssh/config, per host: the jump hosts' addresses, in hop order.
        self.jumps: tuple[SSHAddress | None, ...] = tuple(
            self._jump_chain(spec, config, default_user) for spec in jumps)
        self.proxy_commands: tuple[str | None, ...] = tuple(
            None if p is None or p.strip().lower() == "none" or j is not None else p
            for p, j in zip(proxies, self.jumps, strict=True))

    def _jump_chain(self, spec: str, config: Any, default_user: str) -> SSHAddress | None:
        """``ProxyJump a,b`` -> b reached through a (each hop's own config entry applies)."""
        hops = [h.strip() for h in spec.split(",") if h.strip()]
        if not hops or hops[0].lower() == "none":
            return None
        previous: SSHAddress | None = None
        for hop in hops:
            user, _, rest = hop.rpartition("@")
            if rest.startswith("["):  # [v6]:port
                name, _, tail = rest[1:].partition("]")
                port_text = tail.removeprefix(":")
            else:
                name, _, port_text = rest.partition(":")
            found = config.lookup(name)
            port = _config_port(port_text or None, hop) or _config_port(found.get("port"), name) or 22
            key = self.key or _config_key(found.get("identityfile"))
            previous = SSHAddress(found.get("hostname", name), user or found.get("user") or default_user, port,
                                  key=key, known_hosts=self.known_hosts, verify_host_keys=self.verify_host_keys,
                                  connect_timeout=self.connect_timeout, jump=previous)
        return previous

    # -- the provider contract --------------------------------------------------------------------
    def validate(self, spec: PoolSpec) -> None:
        if spec.max_nodes is not None:  # elastic: the host list is the capacity
            if spec.max_nodes > len(self.hosts):
                raise ConfigError("nodes", f"(min, max) with max <= {len(self.hosts)} (the hosts given to sky.SSH "
                                  "are the pool's capacity)", (spec.nodes, spec.max_nodes))
        elif spec.nodes != len(self.hosts):
            raise ConfigError("nodes", f"{len(self.hosts)} (one node per host given to sky.SSH)", spec.nodes)

    def provision(self, spec: PoolSpec) -> list[Instance]:
        self.validate(spec)
        return [self._instance(spec, i, i) for i in range(spec.nodes)]

    can_acquire = True

    def acquire(self, spec: PoolSpec, nodes: list[int], exclude: frozenset[str]) -> list[Instance]:
        # The first hosts of the list that the pool neither holds nor lost, one per node.
        free = [i for i in range(len(self.hosts)) if self._id(i) not in exclude]
        if len(free) < len(nodes):
            from skyward.errors import CapacityError

            raise CapacityError(f"sky.SSH has {len(free)} host(s) free for {len(nodes)} more node(s) (every host "
                                "of its list is held by the pool, or was lost)", provider=self.name)
        return [self._instance(spec, host, node) for host, node in zip(free, nodes, strict=False)]

    def _id(self, host: int) -> str:
        u, h, p = self.hosts[host]
        return f"ssh:{u}@{h}:{p}"

    def _instance(self, spec: PoolSpec, host: int, node: int) -> Instance:
        count = getattr(spec.accelerator, "count", 0) if spec.accelerator is not None else 0
        return Instance(id=self._id(host), node=node, private_addr=self.private_addrs[host],
                        public_addr=self.hosts[host][1], accelerators=count, environment=self.environment(),
                        ssh=self.address(host))

    def address(self, host: int) -> SSHAddress:
        """How the client reaches host number ``host`` of the list (``~/.ssh/config`` applied)."""
        u, h, p = self.hosts[host]
        return SSHAddress(h, u, p, key=self.keys[host], known_hosts=self.known_hosts,
                          verify_host_keys=self.verify_host_keys, connect_timeout=self.connect_timeout,
                          jump=self.jumps[host], proxy_command=self.proxy_commands[host])

    def environment(self) -> HostEnvironment:
        """Where and how the pool builds an image's environment on the hosts."""
        return HostEnvironment(root=self.root, find_links=self.find_links, no_index=self.no_index,
                               system_site_packages=self.system_site_packages,
                               bootstrap_timeout=self.bootstrap_timeout)

    def terminate(self, instances: list[Instance]) -> None:
        # The hosts are yours: nothing to release. The pool has already stopped every worker
        # and confirmed its process group gone, and closed the connections.
        return None

    def __repr__(self) -> str:
        shown = [f"{u}@{h}" + (f":{p}" if p != 22 else "") for u, h, p in self.hosts]
        return f"SSH(hosts={shown!r})"
