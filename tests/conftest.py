"""Shared fixtures: small, real pools (Local provider, real worker processes)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

import skyward as sky
from tests.hosts.conftest_fixture import test_hosts, wheelhouse  # noqa: F401  (SSH test hosts)


# -- no silent skips in the full check ---------------------------------------------------------------
#: Set by scripts/test.sh, which installs every test dependency and runs as root: there a skipped
#: test is a check that did not run (a missing package, test hosts that could not be made, a build
#: that was slow on a busy machine), so it fails instead, with the reason it gave. Tests that may
#: rightly skip everywhere the suite runs carry ``@pytest.mark.may_skip("why")``.
NO_SKIP = "SKYWARD_TEST_NO_SKIP"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "may_skip(reason): a skip that SKYWARD_TEST_NO_SKIP=1 allows")
    # A suite started in the background of a non-interactive shell (`cmd &` without job control)
    # inherits SIGINT ignored, and every process it starts would too: the Ctrl-C tests' clients
    # and commands would then never see their Ctrl-C. Give them the terminal's default.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    from tests.leftovers import tag_session

    tag_session()  # (before xdist starts its workers: they and every process they start carry it)


@pytest.hookimpl(trylast=True)  # after the session's fixtures are torn down
def pytest_sessionfinish(session: pytest.Session) -> None:
    from tests.leftovers import finish_session

    finish_session(session)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if (report.skipped and not hasattr(report, "wasxfail") and os.environ.get(NO_SKIP) == "1"
            and item.get_closest_marker("may_skip") is None):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped, but {NO_SKIP}=1 (scripts/test.sh) runs every check: {reason}"


@pytest.fixture(scope="module")
def pool2() -> Iterator[sky.ComputePool]:
    """A 2-node Local pool shared by the tests of one module (tasks must leave it clean)."""
    with sky.ComputePool(nodes=2, console=False) as pool:
        yield pool


@pytest.fixture
def ctrl_c() -> Iterator[None]:
    """Ctrl-C (SIGINT) raises KeyboardInterrupt during the test, as in an interactive program,
    whatever this process inherited (a background job of a non-interactive shell, some CI
    runners, start with SIGINT ignored)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def interactive_signals() -> None:
    """``preexec_fn`` for a client program a test interrupts: SIGINT and SIGTERM at their
    defaults, as a program started from a terminal has them (not this process's state)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


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


def parent_of(pid: int) -> int:
    """The parent's pid of ``pid`` (-1 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except OSError:
        return -1


def skyward_workers() -> list[int]:
    """PIDs of the skyward worker processes this test process started (its descendants).

    Only this process's own: other pytest processes on the machine (xdist workers, another
    session) start and stop workers of their own at any moment."""
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if b"skyward.worker" not in cmd or not pid_alive(int(entry)):
            continue
        ancestor = parent_of(int(entry))
        while ancestor > 1 and ancestor != me:
            ancestor = parent_of(ancestor)
        if ancestor == me:
            found.append(int(entry))
    return found


def venv_seeing_this_environment(where: Path) -> Path:
    """A virtual environment of this interpreter that sees its packages; returns its python.

    ``venv --system-site-packages`` alone is not enough when this interpreter is itself a
    virtual environment's (the README's ``python3 -m venv``): the new one is made from the base
    interpreter and sees the base's packages, not this environment's (pytest, cloudpickle). A
    ``.pth`` file adds this environment's site directories (their own ``.pth`` files, such as
    an editable install's, included) after the new environment's own.
    """
    import site
    import subprocess
    import sys

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(where)],
                   check=True)
    python = where / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             check=True, capture_output=True, text=True).stdout.strip()
    ours = [d for d in site.getsitepackages() if Path(d).is_dir()]
    (Path(purelib) / "_skyward_test_parent_env.pth").write_text(
        "".join(f"import site; site.addsitedir({d!r})\n" for d in ours))
    return python

def free_port() -> int:
    """A TCP port nothing listens on now, for a torchrun rendezvous on this machine."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
