"""Shared fixtures: small, real pools (Local provider, real worker processes)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

import skyward as sky
from tests.hosts.conftest_fixture import test_hosts, wheelhouse  # noqa: F401  (SSH test hosts)


@pytest.fixture(scope="module")
def pool2() -> Iterator[sky.ComputePool]:
    """A 2-node Local pool shared by the tests of one module (tasks must leave it clean)."""
    with sky.ComputePool(nodes=2, console=False) as pool:
        yield pool


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return False
    return state != b"Z"


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait until none of ``pids`` is alive; return those still alive at the deadline."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in pids if pid_alive(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def skyward_workers() -> list[int]:
    """PIDs of every skyward worker process on this machine."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if b"skyward.worker" in cmd and pid_alive(int(entry)):
            found.append(int(entry))
    return found
