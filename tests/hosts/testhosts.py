#!/usr/bin/env python3
"""SSH test hosts on this machine, one Linux network namespace each.

Each test host is a real OpenSSH ``sshd`` running

* inside its own network namespace (``<prefix>-hN``), connected by a veth pair
  to a bridge (``<prefix>-br0``) in the root namespace, with its own address
  on a private /24 (by default ``10.213.0.0/24``: bridge ``.1``, host N
  ``.(10+N)``) and a default route via the bridge address;
* inside its own mount and UTS namespaces, where a per-host directory is
  bind-mounted over ``/root`` (the home of the login user) and another over a
  work directory (``/opt/skyward-work``), a per-host ``/etc/hosts`` and
  ``/etc/resolv.conf`` are mounted, and the hostname is the host's name.

Everything else (``/usr``, ``/tmp``, the Python install, this repository) is
shared with this machine, so a host has the same interpreter at the same path
as the process that started it.  When that interpreter lives under ``/root``
(pyenv, a venv in root's home), its prefix is bind-mounted back, read-only by
default, into each host's home so it stays visible.  ``PATH`` in SSH sessions
starts with the directory of that interpreter, so ``python3`` over SSH is the
same interpreter the tests run with.

Nothing is forwarded or NATed to the outside: hosts reach the bridge address
(this machine) and each other, nothing else.  ``with host.behind(bastion):``
leaves a host only a private link to another one (a host behind a jump host).

So no DNS server either: a host's resolver asks its own loopback, where nothing
listens, and a name or address that ``/etc/hosts`` lacks fails at once, as on a
machine whose DNS server answers "no such name".  (With this machine's
nameserver, which a host cannot reach, each such lookup waited out the
resolver's timeouts, 10 s: torch's c10d store looks up its peers' IPv4-mapped
IPv6 addresses, and a 2-node torchrun on the hosts took 30 s longer.)

Use as a module::

    from tests.hosts import testhosts
    hosts = testhosts.up(2)
    rc, out, err = hosts[0].run("hostname")
    testhosts.down()

or as a script (as root)::

    python tests/hosts/testhosts.py up 2
    python tests/hosts/testhosts.py status
    python tests/hosts/testhosts.py down

Standard library only.  Needs root, ``ip`` (iproute2), ``unshare``/``nsenter``
(util-linux), ``sshd``/``ssh``/``ssh-keygen`` (OpenSSH): see install-deps.sh.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import fcntl
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, Sequence

DEFAULT_PREFIX = "skyt"
DEFAULT_SUBNET = "10.213.0.0/24"
DEFAULT_BASE = Path("/tmp/skyward-testhosts")
HOME_MOUNT = "/root"
WORK_MOUNT = "/opt/skyward-work"
SSH_PORT = 22
HOST_OFFSET = 10  # host N gets <network> + 10 + N
SSHD = "/usr/sbin/sshd"
#: A host's resolver: its own loopback, where no DNS server listens (see the module docstring).
RESOLV_CONF = "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"
# The private link of TestHost.behind: a /30 inside two hosts' namespaces, never in the root one.
_BEHIND_NET = "10.214.0"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

__all__ = [
    "TestHost",
    "Slot",
    "up",
    "down",
    "status",
    "load",
    "claim_slot",
    "unavailable_reason",
    "base_dir_for",
    "DEFAULT_PREFIX",
    "DEFAULT_SUBNET",
    "HOME_MOUNT",
    "WORK_MOUNT",
]


class HarnessError(RuntimeError):
    """Setting up the test hosts failed."""


# --------------------------------------------------------------------------
# small helpers


def _sh(
    argv: Sequence[str],
    *,
    check: bool = True,
    timeout: float = 30,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        list(argv),
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise HarnessError(
            f"command failed (rc={proc.returncode}): {shlex.join(argv)}\n"
            f"{proc.stderr.strip() or proc.stdout.strip()}"
        )
    return proc


def _quiet(argv: Sequence[str]) -> None:
    """Run a command, ignoring every failure (for best-effort teardown)."""
    try:
        subprocess.run(list(argv), capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        pass


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.write_text(text)
    os.chmod(path, mode)


def base_dir_for(prefix: str = DEFAULT_PREFIX) -> Path:
    """The directory holding keys, configs and per-host dirs of a harness."""
    return DEFAULT_BASE / prefix


def _netns_list() -> list[str]:
    try:
        out = _sh(["ip", "netns", "list"], check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _link_names() -> list[str]:
    try:
        out = _sh(["ip", "-o", "link", "show"], check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    names = []
    for line in out.splitlines():
        # "12: skyt-h1@if11: <BROADCAST,...> ..."
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@", 1)[0])
    return names


def _netns_inode(netns: str) -> tuple[int, int] | None:
    try:
        st = os.stat(f"/run/netns/{netns}")
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _pids_in_netns(netns: str) -> list[int]:
    """PIDs whose network namespace is ``netns`` (what ``ip netns pids`` does)."""
    ident = _netns_inode(netns)
    if ident is None:
        return []
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{entry}/ns/net")
        except OSError:  # gone, zombie, or kernel thread
            continue
        if (st.st_dev, st.st_ino) == ident:
            pids.append(int(entry))
    return sorted(pids)


def _cmdline(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _is_sshd(pid: int, cmdline: str) -> bool:
    if _comm(pid) == "sshd":
        return True
    first = cmdline.split(" ", 1)[0]
    return first in (SSHD, "sshd") or cmdline.startswith("sshd:")


def _kill_pids(pids: Sequence[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:
            pass


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _tcp_ready(ip: str, port: int, timeout: float = 1.0) -> bool:
    """True when something accepts on ip:port and sends an SSH banner."""
    try:
        with socket.create_connection((ip, port), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def _mount_points() -> list[str]:
    points = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 4:
                    # octal escapes (\040 for space) in mount points
                    points.append(
                        re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
                    )
    except OSError:
        pass
    return points


def _safe_rmtree(path: Path) -> None:
    """rm -rf ``path`` unless something is mounted below it (never follow a mount)."""
    if not path.exists():
        return
    root = str(path.resolve())
    mounted = [m for m in _mount_points() if m == root or m.startswith(root + "/")]
    if mounted:
        print(
            f"testhosts: not removing {root}: mount points below it: {mounted}",
            file=sys.stderr,
        )
        return
    shutil.rmtree(path, ignore_errors=True)


# --------------------------------------------------------------------------
# the host


@dataclasses.dataclass
class TestHost:
    """One SSH test host.  Paths are on this machine's real filesystem."""

    __test__ = False  # not a pytest test class

    name: str  # e.g. "skyt-h1"; also the hostname inside the host
    ip: str  # its address on the bridge, e.g. "10.213.0.11"
    port: int  # 22
    user: str  # "root"
    key_path: str  # private key that logs in as ``user``
    known_hosts: str  # known_hosts file with this host's key (by ip and name)
    known_hosts_all: str  # known_hosts file with the keys of every host of the harness
    home: str  # real dir mounted over /root inside the host
    workdir: str  # real dir mounted over ``work_mount`` inside the host
    netns: str  # network namespace name, e.g. "skyt-h1"
    index: int = 1  # N in "<prefix>-hN"
    dir: str = ""  # per-host harness dir (configs, keys, logs)
    home_mount: str = HOME_MOUNT  # where ``home`` appears inside the host
    work_mount: str = WORK_MOUNT  # where ``workdir`` appears inside the host
    python: str = sys.executable  # interpreter path valid on the host
    bridge_ip: str = ""  # this machine's address as seen from the host
    veth: str = ""  # root-namespace end of the host's veth pair
    prefix: str = DEFAULT_PREFIX

    # -- ssh ---------------------------------------------------------------

    @property
    def address(self) -> str:
        return f"{self.user}@{self.ip}"

    def ssh_options(self) -> list[str]:
        """``ssh`` options that log into this host and verify its host key."""
        return [
            "-F", "/dev/null",
            "-i", self.key_path,
            "-p", str(self.port),
            "-o", "IdentitiesOnly=yes",
            "-o", f"UserKnownHostsFile={self.known_hosts}",
            "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "StrictHostKeyChecking=yes",
            "-o", "BatchMode=yes",
            "-o", "ConnectTimeout=5",
            "-o", "LogLevel=ERROR",
        ]  # fmt: skip

    def ssh_argv(self, cmd: str | None = None) -> list[str]:
        argv = ["ssh", *self.ssh_options(), self.address]
        if cmd is not None:
            argv += ["--", cmd]
        return argv

    def run(
        self, cmd: str, *, timeout: float = 60, input: str | None = None
    ) -> tuple[int, str, str]:
        """Run a shell command on the host over real ssh: (rc, stdout, stderr)."""
        proc = subprocess.run(
            self.ssh_argv(cmd),
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=None if input is not None else subprocess.DEVNULL,
        )
        return proc.returncode, proc.stdout, proc.stderr

    # -- direct access (no ssh) --------------------------------------------

    @property
    def sshd_pid(self) -> int | None:
        """PID of the host's listening sshd, or None if it is not running."""
        try:
            pid = int(Path(self.dir, "sshd.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return pid if _alive(pid) else None

    def exec(
        self, argv: Sequence[str], *, timeout: float = 60
    ) -> tuple[int, str, str]:
        """Run ``argv`` inside the host's namespaces directly (nsenter, no ssh).

        It sees the host's network, hostname, home and work dir, like an SSH
        session does.  Needs the host's sshd to be running.
        """
        pid = self.sshd_pid
        if pid is None:
            raise HarnessError(f"{self.name}: sshd is not running")
        proc = subprocess.run(
            ["nsenter", "-t", str(pid), "-m", "-u", "-n", "--", *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "HOME": self.home_mount},
        )
        return proc.returncode, proc.stdout, proc.stderr

    def processes(self, pattern: str | None = None) -> list[int]:
        """PIDs of processes in this host's network namespace, sshd excluded.

        ``pattern`` is a regular expression searched (``re.search``) in the
        space-joined command line; None lists every non-sshd process.
        """
        rx = re.compile(pattern) if pattern is not None else None
        found = []
        for pid in _pids_in_netns(self.netns):
            cmd = _cmdline(pid)
            if cmd is None or not _alive(pid) or _is_sshd(pid, cmd):
                continue
            if rx is None or rx.search(cmd):
                found.append(pid)
        return found

    def process_cmdlines(self, pattern: str | None = None) -> dict[int, str]:
        """Like :meth:`processes`, with each command line (for messages)."""
        out = {}
        for pid in self.processes(pattern):
            cmd = _cmdline(pid)
            if cmd is not None:
                out[pid] = cmd
        return out

    def kill_processes(self, pattern: str | None = None, sig: int = signal.SIGKILL) -> list[int]:
        """Signal the processes :meth:`processes` lists; returns their PIDs."""
        pids = self.processes(pattern)
        _kill_pids(pids, sig)
        return pids

    def set_link(self, up: bool) -> None:
        """Take the host's network link down (a partition) or back up."""
        _sh(["ip", "link", "set", self.veth, "up" if up else "down"])

    @contextlib.contextmanager
    def behind(self, bastion: "TestHost") -> Iterator[str]:
        """Make this host reachable only through ``bastion``, for the ``with`` block.

        This host's link to the bridge goes down (nothing in the root namespace, the tests
        included, reaches it any more) and a private link, a veth pair that exists only between
        the two hosts' namespaces, joins it to the bastion, which routes this host's address
        over it. The host keeps its address (its sshd and host key stay as they are), so
        ``ssh -J bastion <ip>`` works and ``ssh <ip>`` does not. Yields the bastion's address
        on the private link (the one this host's sshd sees connecting). Everything is undone
        on exit; the private link also goes with either namespace.
        """
        link = "behind0"
        near, far = f"{_BEHIND_NET}.1", f"{_BEHIND_NET}.2"
        _sh(["ip", "link", "add", link, "netns", bastion.netns, "type", "veth",
             "peer", "name", link, "netns", self.netns])  # fmt: skip
        try:
            _sh(["ip", "-n", bastion.netns, "addr", "add", f"{near}/30", "dev", link])
            _sh(["ip", "-n", self.netns, "addr", "add", f"{far}/30", "dev", link])
            _sh(["ip", "-n", bastion.netns, "link", "set", link, "up"])
            _sh(["ip", "-n", self.netns, "link", "set", link, "up"])
            _sh(["ip", "-n", bastion.netns, "route", "add", f"{self.ip}/32", "via", far, "dev", link])
            self.set_link(False)
            yield near
        finally:
            _quiet(["ip", "-n", bastion.netns, "link", "del", link])  # (both ends, and the route)
            self.set_link(True)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------
# up / down / status


def _shared_paths(home_mount: str, extra: Sequence[str] = ()) -> list[str]:
    """Paths under ``home_mount`` that must stay visible inside the hosts:
    the running interpreter's prefixes (pyenv, a venv under /root), plus ``extra``."""
    cands = set()
    for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
              os.path.dirname(sys.executable)):  # fmt: skip
        for q in (p, os.path.realpath(p)):
            cands.add(os.path.normpath(q))
    cands.update(os.path.normpath(os.path.abspath(p)) for p in extra)
    under = sorted(
        p for p in cands
        if p.startswith(home_mount.rstrip("/") + "/") and os.path.isdir(p)
    )  # fmt: skip
    # drop paths nested in another one
    result: list[str] = []
    for p in under:
        if not any(p == r or p.startswith(r + "/") for r in result):
            result.append(p)
    return result


def _sshd_config(host: TestHost, hostdir: Path, session_path: str) -> str:
    return f"""\
# generated by tests/hosts/testhosts.py
Port {host.port}
ListenAddress {host.ip}
AddressFamily inet
HostKey {hostdir}/ssh_host_ed25519_key
PidFile {hostdir}/sshd.pid
AuthorizedKeysFile {hostdir}/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
PrintMotd no
PrintLastLog no
X11Forwarding no
AllowTcpForwarding yes
AllowStreamLocalForwarding yes
MaxStartups 200
MaxSessions 200
LogLevel VERBOSE
SetEnv "PATH={session_path}"
Subsystem sftp internal-sftp
"""


def _start_script(
    host: TestHost, hostdir: Path, shared: Sequence[str], readonly_shared: bool
) -> str:
    """Shell script run in the host's fresh mount+UTS namespaces that prepares
    its view of the filesystem and starts (daemonizes) sshd."""
    q = shlex.quote
    home = q(host.home)
    lines = ["set -e", f"hostname {q(host.name)}"]
    for p in shared:
        rel = os.path.relpath(p, host.home_mount)
        target = f"{host.home}/{rel}"
        lines.append(f"mkdir -p {q(target)}")
        lines.append(f"mount --bind {q(p)} {q(target)}")
        if readonly_shared:
            lines.append(f"mount -o remount,bind,ro {q(target)}")
    lines += [
        f"mount --rbind {home} {q(host.home_mount)}",
        f"mount --bind {q(host.workdir)} {q(host.work_mount)}",
        f"mount --bind {q(str(hostdir / 'hosts'))} /etc/hosts",
        f"mount --bind {q(str(hostdir / 'resolv.conf'))} /etc/resolv.conf",
        f"cd {q(host.home_mount)}",
        f"exec {SSHD} -f {q(str(hostdir / 'sshd_config'))} -E {q(str(hostdir / 'sshd.log'))}",
    ]
    return "\n".join(lines) + "\n"


def _check_prefix(prefix: str, n: int) -> None:
    if not re.fullmatch(r"[a-z][a-z0-9]*", prefix):
        raise ValueError(f"prefix must be lowercase letters/digits: {prefix!r}")
    longest = max(len(f"{prefix}-br0"), len(f"{prefix}-h{n}"))
    if longest > 15:  # IFNAMSIZ - 1
        raise ValueError(f"prefix {prefix!r} too long for interface names")


def unavailable_reason() -> str | None:
    """Why test hosts cannot be made here (not root, no ``ip netns``), or None."""
    if sys.platform != "linux":
        return "SSH test hosts need Linux network namespaces"
    if os.geteuid() != 0:
        return "SSH test hosts need root (network namespaces, bind mounts)"
    if shutil.which("ip") is None:
        return "SSH test hosts need `ip` (iproute2); run tests/hosts/install-deps.sh"
    try:
        proc = _sh(["ip", "netns", "list"], check=False, timeout=10)
    except (OSError, subprocess.SubprocessError) as e:
        return f"`ip netns` unavailable: {e}"
    if proc.returncode != 0:
        return f"`ip netns` unavailable: {proc.stderr.strip()}"
    return None


def _missing_tools() -> list[str]:
    need = ["ip", "unshare", "nsenter", "mount", "ssh", "ssh-keygen"]
    missing = [t for t in need if shutil.which(t) is None]
    if not os.access(SSHD, os.X_OK):
        missing.append(SSHD)
    return missing


def up(
    n: int = 2,
    *,
    prefix: str = DEFAULT_PREFIX,
    subnet: str = DEFAULT_SUBNET,
    base_dir: str | os.PathLike | None = None,
    work_mount: str = WORK_MOUNT,
    readonly_shared: bool = True,
    share: Sequence[str] = (),
    timeout: float = 20.0,
) -> list[TestHost]:
    """Start ``n`` SSH test hosts and return them once every sshd accepts.

    ``prefix`` names the bridge (``<prefix>-br0``), namespaces and veths
    (``<prefix>-hN``); ``subnet`` is the /24 (or larger) they live on.
    ``share`` lists extra paths under /root to keep visible inside the hosts
    (the running interpreter's prefix is always kept);
    ``readonly_shared`` mounts those read-only.  Raises ``HarnessError``
    (after cleaning up) if anything fails, or if a harness with this prefix
    already exists: call :func:`down` first.
    """
    if n < 1:
        raise ValueError("n must be >= 1")
    _check_prefix(prefix, n)
    reason = unavailable_reason()
    if reason:
        raise HarnessError(reason)
    missing = _missing_tools()
    if missing:
        raise HarnessError(
            f"missing {', '.join(missing)}: run tests/hosts/install-deps.sh as root"
        )
    net = ipaddress.ip_network(subnet, strict=False)
    if net.version != 4 or net.num_addresses < HOST_OFFSET + n + 2:
        raise ValueError(f"subnet {subnet} too small for {n} hosts")
    bridge = f"{prefix}-br0"
    existing = [x for x in _netns_list() if _ours(x, prefix)]
    if existing or bridge in _link_names():
        raise HarnessError(
            f"test hosts with prefix {prefix!r} already exist "
            f"({', '.join(existing) or bridge}); call down(prefix={prefix!r}) first"
        )

    base = Path(base_dir) if base_dir is not None else base_dir_for(prefix)
    bridge_ip = str(net.network_address + 1)
    plen = net.prefixlen
    session_path = os.pathsep.join(
        dict.fromkeys([os.path.dirname(sys.executable), *DEFAULT_PATH.split(":")])
    )
    shared = _shared_paths(HOME_MOUNT, share)

    try:
        _safe_rmtree(base)
        base.mkdir(parents=True, exist_ok=True)
        os.chmod(base, 0o700)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd privsep dir
        Path(work_mount).mkdir(parents=True, exist_ok=True)  # mount point

        # client key pair, shared by all hosts of this harness
        key = base / "id_ed25519"
        _sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C",
             f"skyward-testhosts-{prefix}", "-f", str(key)])  # fmt: skip
        client_pub = (base / "id_ed25519.pub").read_text()

        # bridge
        _sh(["ip", "link", "add", "name", bridge, "type", "bridge"])
        _sh(["ip", "addr", "add", f"{bridge_ip}/{plen}", "dev", bridge])
        _sh(["ip", "link", "set", bridge, "up"])

        hosts: list[TestHost] = []
        known_all = base / "known_hosts"
        for i in range(1, n + 1):
            name = f"{prefix}-h{i}"
            ip = str(net.network_address + HOST_OFFSET + i)
            hostdir = base / name
            home = hostdir / "home"
            work = hostdir / "work"
            for d in (hostdir, home, work):
                d.mkdir(parents=True, exist_ok=True)
            os.chmod(home, 0o700)
            host = TestHost(
                name=name,
                ip=ip,
                port=SSH_PORT,
                user="root",
                key_path=str(key),
                known_hosts=str(hostdir / "known_hosts"),
                known_hosts_all=str(known_all),
                home=str(home),
                workdir=str(work),
                netns=name,
                index=i,
                dir=str(hostdir),
                home_mount=HOME_MOUNT,
                work_mount=work_mount,
                python=sys.executable,
                bridge_ip=bridge_ip,
                veth=name,
                prefix=prefix,
            )
            hosts.append(host)

            # network: netns, veth pair (root end on the bridge), address, route
            _sh(["ip", "netns", "add", name])
            _sh(["ip", "link", "add", host.veth, "type", "veth",
                 "peer", "name", "eth0", "netns", name])  # fmt: skip
            _sh(["ip", "link", "set", host.veth, "master", bridge])
            _sh(["ip", "link", "set", host.veth, "up"])
            _sh(["ip", "-n", name, "link", "set", "lo", "up"])
            _sh(["ip", "-n", name, "addr", "add", f"{ip}/{plen}", "dev", "eth0"])
            _sh(["ip", "-n", name, "link", "set", "eth0", "up"])
            _sh(["ip", "-n", name, "route", "add", "default", "via", bridge_ip])

            # keys and config
            hkey = hostdir / "ssh_host_ed25519_key"
            _sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(hkey)])
            ktype, kdata = (hostdir / "ssh_host_ed25519_key.pub").read_text().split()[:2]
            line = f"{ip},{name} {ktype} {kdata}\n"
            _write(Path(host.known_hosts), line)
            with open(known_all, "a") as f:
                f.write(line)
            _write(hostdir / "authorized_keys", client_pub, 0o600)
            _write(hostdir / "sshd_config", _sshd_config(host, hostdir, session_path))

        etc_hosts = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
        etc_hosts += f"{bridge_ip}\t{prefix}-bridge\n"
        etc_hosts += "".join(f"{h.ip}\t{h.name}\n" for h in hosts)
        for host in hosts:
            hostdir = Path(host.dir)
            _write(hostdir / "hosts", etc_hosts)
            _write(hostdir / "resolv.conf", RESOLV_CONF)
            script = _start_script(host, hostdir, shared, readonly_shared)
            _write(hostdir / "start.sh", script, 0o755)
            proc = _sh(
                ["ip", "netns", "exec", host.netns,
                 "unshare", "--mount", "--uts", "--propagation", "private",
                 "/bin/sh", str(hostdir / "start.sh")],
                check=False,
            )  # fmt: skip
            if proc.returncode != 0:
                log = _tail(hostdir / "sshd.log")
                raise HarnessError(
                    f"{host.name}: starting sshd failed (rc={proc.returncode}): "
                    f"{proc.stderr.strip()}\n{log}"
                )

        deadline = time.monotonic() + timeout
        pending = list(hosts)
        while pending:
            pending = [h for h in pending if not _tcp_ready(h.ip, h.port, 0.5)]
            if not pending:
                break
            if time.monotonic() > deadline:
                detail = "; ".join(
                    f"{h.name}: {_tail(Path(h.dir) / 'sshd.log')}" for h in pending
                )
                raise HarnessError(f"sshd did not come up in {timeout}s: {detail}")
            time.sleep(0.02)

        _write(base / "state.json", json.dumps([h.to_dict() for h in hosts], indent=2))
        return hosts
    except BaseException:
        down(prefix=prefix, base_dir=base)
        raise


def _tail(path: Path, n: int = 10) -> str:
    try:
        return "\n".join(path.read_text().splitlines()[-n:])
    except OSError:
        return ""


def _ours(netns: str, prefix: str) -> bool:
    return re.fullmatch(rf"{re.escape(prefix)}-h\d+", netns) is not None


def load(
    prefix: str = DEFAULT_PREFIX, base_dir: str | os.PathLike | None = None
) -> list[TestHost]:
    """The hosts of a running harness (e.g. one started by the CLI)."""
    base = Path(base_dir) if base_dir is not None else base_dir_for(prefix)
    try:
        data = json.loads((base / "state.json").read_text())
    except (OSError, ValueError):
        return []
    return [TestHost(**d) for d in data]


def down(
    prefix: str = DEFAULT_PREFIX,
    base_dir: str | os.PathLike | None = None,
    *,
    keep_files: bool = False,
) -> None:
    """Kill everything in the harness's namespaces and remove namespaces,
    veths, bridge and files.  Best effort and idempotent: never raises for
    things already gone, works after a crashed or partial :func:`up`."""
    base = Path(base_dir) if base_dir is not None else base_dir_for(prefix)
    netnses = [x for x in _netns_list() if _ours(x, prefix)]

    # 1. kill every process in the namespaces (repeat: they may fork meanwhile)
    #    and any sshd of this harness that lost its namespace name (found by
    #    its config path; pid files are not trusted, pids get reused).
    base_str = str(base) + "/"
    for _ in range(50):
        pids: set[int] = set()
        for ns in netnses:
            pids.update(_pids_in_netns(ns))
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                cmd = _cmdline(int(entry))
                # sshd rewrites its title to "sshd: /usr/sbin/sshd -f <cfg> ..."
                if cmd and base_str in cmd and _is_sshd(int(entry), cmd):
                    pids.add(int(entry))
        pids.discard(os.getpid())
        pids = {p for p in pids if _alive(p)}
        if not pids:
            break
        _kill_pids(sorted(pids))
        time.sleep(0.02)

    # 2. links: veths (deleting one end removes the pair) then the bridge
    links = _link_names()
    for name in links:
        if _ours(name, prefix):
            _quiet(["ip", "link", "del", name])
    for ns in netnses:
        _quiet(["ip", "netns", "del", ns])
    if f"{prefix}-br0" in links:
        _quiet(["ip", "link", "del", f"{prefix}-br0"])

    # 3. files
    if not keep_files:
        _safe_rmtree(base)


def status(
    prefix: str = DEFAULT_PREFIX, base_dir: str | os.PathLike | None = None
) -> list[dict]:
    """One dict per known host: name, ip, netns present, sshd pid, port open,
    and the other processes in its namespace."""
    hosts = load(prefix, base_dir)
    netnses = set(_netns_list())
    rows = []
    for h in hosts:
        rows.append(
            {
                "name": h.name,
                "ip": h.ip,
                "netns": h.netns in netnses,
                "sshd_pid": h.sshd_pid,
                "ssh_port_open": _tcp_ready(h.ip, h.port, 0.5),
                "processes": h.process_cmdlines() if h.netns in netnses else {},
            }
        )
    # leftovers not in the state file (crashed up)
    known = {h.netns for h in hosts}
    for ns in sorted(netnses):
        if _ours(ns, prefix) and ns not in known:
            rows.append({"name": ns, "ip": None, "netns": True, "sshd_pid": None,
                         "ssh_port_open": False, "processes": {}})  # fmt: skip
    return rows


# --------------------------------------------------------------------------
# slots: several harnesses at once (concurrent pytest sessions)


@dataclasses.dataclass
class Slot:
    """An exclusively held (prefix, subnet) pair; see :func:`claim_slot`."""

    index: int
    prefix: str
    subnet: str
    lock_path: str


def _try_slot(k: int, prefix: str) -> int | None:
    """The locked file descriptor of slot ``k``, or None when another holder has it."""
    lock_path = DEFAULT_BASE / f"slot-{prefix}{k}.lock"
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        raise
    return fd


@contextlib.contextmanager
def claim_slot(max_slots: int = 16, *, prefix: str = "skyp", wait: float = 900.0) -> Iterator[Slot]:
    """Hold a free slot for the duration of the ``with`` block.

    Slot k is prefix ``<prefix><k>`` on subnet ``10.213.(100+k).0/24``.  The
    lock is an flock on a file, so it is released when the holder dies, and
    leftovers of a dead holder can be cleared with ``down(slot.prefix)``.
    When every slot is held (several suites at once on one machine), it waits up to
    ``wait`` seconds for one to be released, then raises :class:`HarnessError`.
    """
    DEFAULT_BASE.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait
    while True:
        for k in range(max_slots):
            fd = _try_slot(k, prefix)
            if fd is None:
                continue
            lock_path = DEFAULT_BASE / f"slot-{prefix}{k}.lock"
            try:
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
                yield Slot(k, f"{prefix}{k}", f"10.213.{100 + k}.0/24", str(lock_path))
                return
            finally:
                os.close(fd)  # releases the lock
        if time.monotonic() >= deadline:
            raise HarnessError(f"all {max_slots} test-host slots are in use (waited {wait:.0f} s)")
        time.sleep(0.5)  # a slot is freed by its holder's exit: no event to wait on across processes


# --------------------------------------------------------------------------
# CLI


def _main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="SSH test hosts in network namespaces")
    ap.add_argument("--prefix", default=DEFAULT_PREFIX)
    ap.add_argument("--base-dir", default=None)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="start N hosts (clears leftovers of this prefix first)")
    p_up.add_argument("n", type=int, nargs="?", default=2)
    p_up.add_argument("--subnet", default=DEFAULT_SUBNET)
    p_up.add_argument("--work-mount", default=WORK_MOUNT)
    p_up.add_argument("--writable-shared", action="store_true",
                      help="mount the shared interpreter prefix read-write")  # fmt: skip
    p_up.add_argument("--json", action="store_true", help="print the hosts as JSON")
    sub.add_parser("down", help="stop and remove all hosts of this prefix")
    p_st = sub.add_parser("status", help="show the hosts of this prefix")
    p_st.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    if args.cmd == "up":
        down(args.prefix, args.base_dir)
        t0 = time.monotonic()
        hosts = up(
            args.n,
            prefix=args.prefix,
            subnet=args.subnet,
            base_dir=args.base_dir,
            work_mount=args.work_mount,
            readonly_shared=not args.writable_shared,
        )
        if args.json:
            print(json.dumps([h.to_dict() for h in hosts], indent=2))
        else:
            print(f"{len(hosts)} host(s) up in {time.monotonic() - t0:.2f}s")
            for h in hosts:
                print(f"  {h.name:10} {h.ip:15} home={h.home} work={h.workdir}")
            h = hosts[0]
            print("ssh:", shlex.join(h.ssh_argv()))
        return 0
    if args.cmd == "down":
        t0 = time.monotonic()
        down(args.prefix, args.base_dir)
        print(f"down in {time.monotonic() - t0:.2f}s")
        return 0
    rows = status(args.prefix, args.base_dir)
    if args.json:
        print(json.dumps(rows, indent=2))
    elif not rows:
        print(f"no test hosts with prefix {args.prefix!r}")
    else:
        for r in rows:
            procs = ", ".join(f"{p}:{c[:40]}" for p, c in r["processes"].items())
            print(
                f"{r['name']:10} {r['ip'] or '-':15} netns={'yes' if r['netns'] else 'NO'}"
                f" sshd={r['sshd_pid'] or 'DOWN'} port22={'open' if r['ssh_port_open'] else 'closed'}"
                + (f" procs=[{procs}]" if procs else "")
            )
    return 0


if __name__ == "__main__":
    sys.exit(_main())
