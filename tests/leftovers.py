"""The suite leaves nothing behind: cluster homes that end their clusters even when one is still
held, and the session's check that no skyward worker it started outlives it.

Every process this test session starts inherits :data:`SESSION_VAR` (set once, in the first
pytest process, before any xdist worker starts), so a worker that a named cluster detached
from its client is still known as this session's.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator

import pytest

import skyward as sky
from skyward.clusters import manage
from tests.conftest import parent_of, pid_alive, wait_gone

#: The variable that marks every process of this test session (its value: the session's tag).
SESSION_VAR = "SKYWARD_TEST_SESSION"
#: Seconds a worker may take to end by itself once the session is over (autostop, a departed
#: client's workers), before it counts as left behind (``SKYWARD_TEST_SETTLE`` changes it).
SETTLE = float(os.environ.get("SKYWARD_TEST_SETTLE", "20"))
_homes: list[str] = []


def tag_session() -> None:
    """Mark this process (and so every process it starts) as this session's."""
    os.environ.setdefault(SESSION_VAR, uuid.uuid4().hex)


def session_workers() -> dict[int, str]:
    """Every skyward worker process on this machine started by this session: pid -> command line."""
    needle = f"{SESSION_VAR}={os.environ[SESSION_VAR]}".encode()
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue
        if b"skyward.worker" in cmdline and needle in environ and pid_alive(int(entry)):
            found[int(entry)] = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
    return found


def _descends_from_me(pid: int) -> bool:
    ancestor = parent_of(pid)
    while ancestor > 1 and ancestor != os.getpid():
        ancestor = parent_of(ancestor)
    return ancestor == os.getpid()


def end_clusters() -> list[str]:
    """End every cluster of the current SKYWARD_HOME, held or not; returns the problems.

    ``skyward down`` refuses a cluster another client holds (ClusterBusy). A test's client that
    still holds one when the test ends is one this process started: it is killed, then the
    cluster is ended the ordinary way. A cluster still held after that (by a pool this process
    left open, or a process that is not ours) has its nodes ended without the lock, as
    ``down`` would, and its record removed."""
    problems: list[str] = []
    for record in manage.ClusterStore().all():
        try:
            problems += manage.down(record.name)
            continue
        except sky.ClusterBusy as busy:
            holder = busy.pid
        if holder is not None and holder != os.getpid() and _descends_from_me(holder):
            os.kill(holder, signal.SIGKILL)
            wait_gone([holder], 10)
            with contextlib.suppress(sky.ClusterBusy):
                problems += manage.down(record.name)
                continue
        problems += manage.nodes_for(record).down()
        manage.ClusterStore().remove(record.name)
    return problems


@contextlib.contextmanager
def cluster_home(monkeypatch: pytest.MonkeyPatch, prefix: str) -> Iterator[str]:
    """A SKYWARD_HOME of the test's own (short: socket paths must stay under 108 bytes). Every
    cluster left in it is ended afterwards, even one a client still holds, and the folder is
    removed, so a failing test leaks nothing."""
    path = tempfile.mkdtemp(prefix=prefix)
    _homes.append(path)
    monkeypatch.setenv("SKYWARD_HOME", path)
    try:
        yield path
    finally:
        problems = end_clusters()
        shutil.rmtree(path, ignore_errors=True)
        _homes.remove(path)
        assert not problems, f"a cluster of this test could not be ended: {problems}"


def finish_session(session: pytest.Session) -> None:
    """(At the end of the session) Remove the cluster homes a crashed teardown left; fail the
    session, loudly, if a skyward worker it started is still alive (then end it)."""
    for path in list(_homes):
        shutil.rmtree(path, ignore_errors=True)
    if hasattr(session.config, "workerinput"):  # an xdist worker: the first process checks, at the end
        return
    deadline = time.monotonic() + SETTLE
    while (left := session_workers()) and time.monotonic() < deadline:
        time.sleep(0.2)
    if not left:
        return
    lines = "\n".join(f"  pid {pid}: {cmd}" for pid, cmd in sorted(left.items()))
    sys.stderr.write(f"\n\nSKYWARD TEST SESSION LEFT {len(left)} WORKER(S) RUNNING "
                     f"({SETTLE:.0f} s after its last test); ending them now:\n{lines}\n\n")
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    if session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
