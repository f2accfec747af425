"""Connections opened ahead of need: a command that knows its machines before it has loaded what
uses them (``skyward exec NAME``: the cluster's record is read in milliseconds, the pool that
attaches to it takes ~0.2 s of imports) starts the SSH handshakes first, and the transport that
:func:`skyward.transport.reach` returns for one of those machines is the one already connecting.

Guarantees:

1. Warming is a hint, never a failure: a handshake that fails is forgotten, and whoever reaches
   the machine connects again (with its own retries and its own error).
2. Each warm connection is handed out once, by :func:`take`, to a caller that then owns it
   (and closes it) as it would own a fresh transport; :func:`release` closes those never taken.
3. A caller that takes one while its handshake is still going waits for it (the transport's
   own lock), never opens a second connection to the same machine.

Measured on the test hosts (2 nodes, this machine's 2 cores): the handshakes (0.1-0.2 s) overlap
the imports of the pool instead of following them.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from skyward.machine import Instance, SSHAddress
    from skyward.transport.ssh import SSHTransport

__all__ = ["release", "take", "warm"]

_lock = threading.Lock()
_warm: dict[tuple[SSHAddress, tuple[str, ...]], SSHTransport] = {}


def warm(instances: Iterable[Instance]) -> None:
    """Start connecting to each of ``instances`` reached over SSH, in threads of their own
    (daemons: a process that ends meanwhile does not wait for them)."""
    from skyward.transport.ssh import SSHTransport

    for inst in instances:
        if inst.ssh is None:
            continue
        key = (inst.ssh, tuple(inst.launcher))
        with _lock:
            if key in _warm:
                continue
            transport = _warm[key] = SSHTransport.to(inst.ssh, inst.launcher)
        threading.Thread(target=_connect, args=(transport,), name="skyward-warm-ssh", daemon=True).start()


def _connect(transport: SSHTransport) -> None:
    with contextlib.suppress(Exception):  # (guarantee 1: the taker connects again, and says why)
        transport.connect()


def take(instance: Instance) -> SSHTransport | None:
    """The warm transport to ``instance`` (the caller's from now on), or None."""
    if instance.ssh is None or not _warm:
        return None
    with _lock:
        return _warm.pop((instance.ssh, tuple(instance.launcher)), None)


def release() -> None:
    """Close the warm connections no one took (in threads: one still connecting to a host that
    does not answer delays no one; the process's end cuts it)."""
    with _lock:
        left = list(_warm.values())
        _warm.clear()
    for transport in left:
        threading.Thread(target=_close, args=(transport,), name="skyward-warm-close", daemon=True).start()


def _close(transport: SSHTransport) -> None:
    with contextlib.suppress(Exception):
        transport.close()
