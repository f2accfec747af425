"""Tasks the contract tests share."""

from __future__ import annotations

import os
import sys
import time

import cloudpickle

import skyward as sky

# The SSH hosts cannot import this repository's ``tests`` package: ship this module's code
# with the tasks that use it, as cloudpickle does for the code of a user's script.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@sky.compute
def echo(value: object) -> object:
    return value


@sky.compute
def node_of() -> int:
    return sky.instance_info().node


def wait_for_file(path: str, limit: float) -> bool:
    """Wait (on the worker) until ``path`` exists; False if it did not within ``limit`` seconds.

    The hosts share this machine's /tmp, so the test (or another task) releases a task by
    creating a file there.
    """
    deadline = time.monotonic() + limit
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@sky.compute
def held(path: str, value: object, limit: float = 20.0) -> object:
    """Return ``value`` once ``path`` exists (``"gave up"`` after ``limit`` seconds)."""
    return value if wait_for_file(path, limit) else "gave up"


@sky.compute
def announce_then_hold(tag: str, path: str, limit: float = 30.0) -> str:
    """Print ``"<tag> started on <node>"``, then hold until ``path`` exists (or ``limit`` s)."""
    print(f"{tag} started on {sky.instance_info().node}", flush=True)
    return "released" if wait_for_file(path, limit) else "gave up"
