"""Tasks of the elastic-pool contract tests (shipped by value: the SSH hosts cannot import ``tests``)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import cloudpickle

import skyward as sky

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@sky.compute
def pause_then(value: int, seconds: float) -> int:
    """``value`` after ``seconds``: a task that holds a slot."""
    time.sleep(seconds)
    return value


@sky.compute
def leave_a_process(prefix: str) -> int:
    """Start a process in a session of its own (as a daemon would), write its pid and the
    worker's to ``<prefix>-<node>``, return the node."""
    child = subprocess.Popen(["sleep", "3600"], start_new_session=True, stdin=subprocess.DEVNULL)
    path = f"{prefix}-{sky.instance_info().node}"
    with open(path + ".part", "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    os.replace(path + ".part", path)
    return sky.instance_info().node


@sky.compute
def die_once(marker: str, value: int) -> int:
    """The first run (``marker`` absent) kills its own worker outright; later runs return
    ``value``. Counts its runs in ``marker``."""
    runs = int(open(marker).read()) if os.path.exists(marker) else 0
    with open(marker, "w") as f:
        f.write(str(runs + 1))
    if runs == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    return value


@sky.compute
def fail_counting(marker: str) -> int:
    """Count the run in ``marker``, then raise in user code."""
    runs = int(open(marker).read()) if os.path.exists(marker) else 0
    with open(marker, "w") as f:
        f.write(str(runs + 1))
    raise ValueError("user code failed")


@sky.compute
def node_and_pid() -> tuple[int, int, int]:
    """(node, total nodes, the worker's pid)."""
    info = sky.instance_info()
    return info.node, info.total_nodes, os.getpid()


@sky.compute
def hold_unless_head(marker: str) -> int:
    """Node 0 returns at once; any other node says it holds (``marker.held`` appears) and holds
    its slot until ``marker`` exists (60 s at most). Returns the node."""
    node = sky.instance_info().node
    if node != 0:
        Path(marker + ".held").touch()
    deadline = time.monotonic() + 60.0
    while node != 0 and not os.path.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    return node


@contextlib.contextmanager
def held_while(marker: str, info: sky.InstanceInfo) -> Iterator[None]:
    """An ``around_app`` that holds a worker's start while ``marker`` exists (60 s at most)."""
    deadline = time.monotonic() + 60.0
    while os.path.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    yield
