"""The SSH provider: machines you already have, reached over SSH.

Each host given to :class:`SSH` is one node. Starting a pool connects to every host (in
parallel, one SSH connection each), ships the client's skyward as a wheel, builds the
image's environment with the bootstrap script (skipped when the host already has it), and
starts the worker over the same connection. Nothing is bought, so nothing is released
afterwards — but no skyward process is left running on any host (see :mod:`skyward.transport.ssh`).

Layout on a host, under ``root`` (default ``~/.skyward``)::

    wheels/<sha>/skyward-<version>-py3-none-any.whl   the client's skyward, by content
    bootstrap/<env>.sh                                the bootstrap script (mode 0600)
    envs/<env>/                                       the venv for an image (+ .ready marker)
    include/<include_hash>/                           the image's include files
    uv-pkg/                                           uv, when the host had none

paramiko is imported when an ``SSH`` provider is made (it reads ``~/.ssh/config``), never by
``import skyward``.
"""

from __future__ import annotations

import collections
import getpass
import io
import os
import shlex
import tarfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from skyward.errors import BootstrapError, ConfigError
from skyward.providers.base import Instance, PoolSpec, Provider
from skyward.transport.base import Transport, WorkerLaunch

__all__ = ["SSH"]

_LOG_TAIL = 40


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
    try:
        import paramiko
    except ImportError as exc:
        raise ImportError("sky.SSH needs paramiko: pip install 'skyward[ssh]'") from exc
    try:
        text = Path(os.path.expanduser("~/.ssh/config")).read_text(errors="replace")
    except OSError:
        text = ""
    return paramiko.SSHConfig.from_text(text)


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
            ``~/.ssh/config`` knows takes its ``HostName``, ``User`` and ``Port`` from there
            (what the entry or ``user``/``port`` say wins).
        user: login user for hosts that don't name one (default: ``~/.ssh/config``'s ``User``
            for the host, else your local user name).
        key: a private key file. When given, only this key is offered; when None, the SSH
            agent's keys and ``~/.ssh/id_*`` are tried.
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
    uses_client_environment = False

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
        for entry_user, name, entry_port in o.hosts:
            # As with `ssh -l user -p port name`: what the entry or the arguments say wins over
            # ~/.ssh/config, which wins over the defaults (your user name, port 22).
            found = config.lookup(name)
            login = entry_user or o.user or found.get("user") or default_user
            number = entry_port or o.port or _config_port(found.get("port"), name) or 22
            hosts_.append((login, found.get("hostname", name), number))
        self.hosts: tuple[tuple[str, str, int], ...] = tuple(hosts_)
        self.key = None if key is None else key_file("key", key)
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

    # -- the provider contract --------------------------------------------------------------------
    def validate(self, spec: PoolSpec) -> None:
        if spec.nodes != len(self.hosts):
            raise ConfigError("nodes", f"{len(self.hosts)} (one node per host given to sky.SSH)", spec.nodes)

    def provision(self, spec: PoolSpec) -> list[Instance]:
        self.validate(spec)
        count = getattr(spec.accelerator, "count", 0) if spec.accelerator is not None else 0
        return [
            Instance(id=f"ssh:{u}@{h}:{p}", node=i, private_addr=self.private_addrs[i], public_addr=h,
                     accelerators=count)
            for i, (u, h, p) in enumerate(self.hosts)
        ]

    def transport(self, instance: Instance) -> Transport:
        from skyward.transport.ssh import SSHTransport

        user, address, port = self.hosts[instance.node]
        return SSHTransport(address, port=port, user=user, key_filename=self.key, known_hosts=self.known_hosts,
                            verify_host_keys=self.verify_host_keys, connect_timeout=self.connect_timeout)

    def terminate(self, instances: list[Instance]) -> None:
        # The hosts are yours: nothing to release. The pool has already stopped every worker
        # and confirmed its process group gone, and closed the connections.
        return None

    def worker_launch(self, instance: Instance, transport: Transport, image: Any,
                      log: Callable[[str], None]) -> WorkerLaunch:
        """Connect, ship skyward and the include files, build the environment; say how to start.

        Raises BootstrapError naming the host, the step (``connect``, ``upload``, ``include``,
        or the bootstrap step that failed: ``uv``, ``apt``, ``venv``, ``pip``, ``setup``,
        ``skyward``) and the last lines of output.
        """
        from skyward.transport.ssh import SSHTransport

        assert isinstance(transport, SSHTransport)
        return _Bootstrap(self, instance, transport, image, log).run()

    def __repr__(self) -> str:
        shown = [f"{u}@{h}" + (f":{p}" if p != 22 else "") for u, h, p in self.hosts]
        return f"SSH(hosts={shown!r})"


class _Bootstrap:
    """Preparing one host: every step, with its log tail, for one ``worker_launch`` call."""

    def __init__(self, provider: SSH, instance: Instance, transport: Any, image: Any, log: Callable[[str], None]):
        self.provider = provider
        self.instance = instance
        self.transport = transport
        self.image = image
        self.log = log
        self.tail: collections.deque[str] = collections.deque(maxlen=_LOG_TAIL)
        self.step = "connect"

    def note(self, line: str) -> None:
        self.tail.append(line)
        self.log(line)

    def fail(self, message: str, exit_code: int | None = None) -> BootstrapError:
        return BootstrapError(self.transport.host, self.step, message, exit_code=exit_code,
                              log_tail=list(self.tail), node=self.instance.node)

    def run(self) -> WorkerLaunch:
        try:
            return self._run()
        except BootstrapError:
            raise
        except (OSError, EOFError, TimeoutError) as exc:
            raise self.fail(f"{type(exc).__name__}: {exc}") from exc
        except Exception as exc:
            if type(exc).__module__.startswith("paramiko"):
                raise self.fail(f"SSH error: {exc}") from exc
            raise

    def _run(self) -> WorkerLaunch:
        from skyward import _ship
        from skyward.bootstrap import render, worker_command

        t = self.transport
        p = self.provider
        self.note(f"connecting to {t.host}")
        started = time.monotonic()
        t.connect(node=self.instance.node, log_tail=list(self.tail))
        self.note(f"connected in {time.monotonic() - started:.2f}s")

        self.step = "upload"
        root = t.expand(p.root)
        wheel = _ship.skyward_wheel()
        wheel_dir = f"{root}/wheels/{wheel.sha256[:16]}"
        self._sh(f"umask 077 && mkdir -p {shlex.quote(wheel_dir)} {shlex.quote(root + '/bootstrap')}")
        remote_wheel = f"{wheel_dir}/{wheel.name}"
        if t.exists(remote_wheel, size=wheel.path.stat().st_size):
            self.note(f"skyward wheel {wheel.sha256[:16]} already on the host")
        else:
            t.put(str(wheel.path), remote_wheel, mode=0o644)
            self.note(f"uploaded skyward wheel {wheel.sha256[:16]}")

        pythonpath: list[str] = []
        if self.image.include:
            self.step = "include"
            pythonpath.append(self._sync_include(root))

        self.step = "bootstrap"
        script = render(self.image, root=root, skyward_wheel=remote_wheel, find_links=p.find_links,
                        no_index=p.no_index, system_site_packages=p.system_site_packages)
        path = f"{root}/bootstrap/{script.hash}.sh"
        # The script may hold secrets (the image's env): a private file, never a command line.
        t.put_bytes(script.text.encode(), path, mode=0o600)
        self._bootstrap(path)
        command = worker_command(script, root=root, pythonpath=pythonpath)
        return WorkerLaunch(("bash", "-c", command), {}, None)

    def _sh(self, command: str, stdin: bytes | None = None) -> None:
        result = self.transport.run(command, timeout=max(60.0, self.provider.connect_timeout), stdin=stdin)
        if not result.ok:
            for line in (result.stdout + result.stderr).splitlines()[-10:]:
                self.note(line)
            raise self.fail(f"`{command[:80]}` failed", result.exit_code)

    def _sync_include(self, root: str) -> str:
        from skyward.image import _included_files

        digest = self.image.include_hash()
        final = f"{root}/include/{digest}"
        if self.transport.exists(final + "/.complete"):
            self.note(f"include files {digest} already on the host")
            return final
        # One archive over SFTP, unpacked beside the target and renamed into place, so a
        # half-copied tree is never used (and two pools racing end up with one copy).
        buffer = io.BytesIO()
        count = 0
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            for include in self.image.include:
                for rel, path in _included_files(Path(include)):
                    info = tar.gettarinfo(str(path), arcname=rel)
                    info.uid = info.gid = 0
                    info.uname = info.gname = ""
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
                    count += 1
        tag = uuid.uuid4().hex[:8]
        archive = f"{root}/include/.{digest}.{tag}.tar.gz"
        staging = f"{root}/include/.{digest}.{tag}"
        self._sh(f"umask 077 && mkdir -p {shlex.quote(root + '/include')}")
        self.transport.put_bytes(buffer.getvalue(), archive, mode=0o600)
        q = shlex.quote
        self._sh(
            f"mkdir -p {q(staging)} && tar -xzf {q(archive)} --no-same-owner -C {q(staging)} && rm -f {q(archive)} "
            f"&& : > {q(staging + '/.complete')} "
            f"&& if [ -e {q(final)} ]; then rm -rf {q(staging)}; else mv {q(staging)} {q(final)}; fi"
        )
        self.note(f"synced {count} include file(s) to {final}")
        return final

    def _bootstrap(self, script_path: str) -> None:
        from skyward.bootstrap import WARM_PREFIX, parse_step

        last_error = ""
        lock = threading.Lock()

        def on_line(stream: str, line: str) -> None:
            nonlocal last_error
            with lock:
                found = parse_step(line)
                if found is not None:
                    self.step = found
                elif stream == "stderr" and line.strip():
                    last_error = line.strip().removeprefix("skyward bootstrap: ")
                self.note(line)

        started = time.monotonic()
        try:
            code = self.transport.stream(f"bash {shlex.quote(script_path)}", on_line,
                                         timeout=self.provider.bootstrap_timeout)
        except TimeoutError as exc:
            raise self.fail(f"the environment build took longer than {self.provider.bootstrap_timeout:g}s") from exc
        if code == -1:
            raise self.fail("the connection dropped during the environment build")
        if code != 0:
            raise self.fail(f"the bootstrap script failed: {last_error}" if last_error else
                            "the bootstrap script failed", code)
        warm = any(line.startswith(WARM_PREFIX) for line in self.tail)
        self.note(f"environment {'reused' if warm else 'built'} in {time.monotonic() - started:.1f}s")

