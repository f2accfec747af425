"""Session-scoped pytest fixtures for SSH test hosts (see testhosts.py): ``test_hosts`` and
``wheelhouse``, plus :func:`ssh_provider`, an SSH provider for them.

Import the fixtures into a conftest.py::

    from tests.hosts.conftest_fixture import test_hosts, wheelhouse  # noqa: F401

A test that takes ``test_hosts`` gets a list of ``TEST_HOSTS_N`` (default 2)
:class:`tests.hosts.testhosts.TestHost`, each a real sshd in its own network
namespace with a private home and work dir.  The fixture skips only when the
machine cannot make them at all (not root, no ``ip netns``); anything else
that goes wrong (sshd missing, a start failure) is an error.  Each pytest
process takes its own slot (prefix ``skypK``, subnet ``10.213.(100+K).0/24``),
so concurrent sessions on one machine don't disturb each other; leftovers of
a crashed session in that slot are cleared before starting, and everything is
torn down at the end of the session even if tests fail.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

import skyward as sky
from tests.hosts import testhosts

DEFAULT_N = 2

# skyward's own dependencies, uv (so the hosts need no index to get it), and one package
# that neither this machine's interpreter nor the hosts have (test_ssh.py's ABSENT_PACKAGE).
WHEELHOUSE_REQUIREMENTS = ("uv", "cloudpickle>=2.1", "pydantic>=2.5", "rich>=13", "tomli")


@pytest.fixture(scope="session")
def test_hosts() -> Iterator[list[testhosts.TestHost]]:
    reason = testhosts.unavailable_reason()
    if reason:
        pytest.skip(reason)
    n = int(os.environ.get("TEST_HOSTS_N", DEFAULT_N))
    with testhosts.claim_slot() as slot:
        testhosts.down(prefix=slot.prefix)  # leftovers of a crashed session
        try:
            yield testhosts.up(n, prefix=slot.prefix, subnet=slot.subnet)
        finally:
            testhosts.down(prefix=slot.prefix)


@pytest.fixture(scope="session")
def wheelhouse() -> str:
    """A directory of wheels for the hosts, downloaded once and reused across sessions.

    The hosts cannot reach the internet: packages come from here (under /tmp, which the hosts
    share) and are installed with ``no_index=True``.
    """
    return downloaded_wheels(WHEELHOUSE_REQUIREMENTS)


def downloaded_wheels(requirements: tuple[str, ...]) -> str:
    """A directory of the wheels of ``requirements`` (and their dependencies) under /tmp,
    downloaded once for this Python and machine, and reused across sessions."""
    key = hashlib.sha256(json.dumps([requirements, sys.version_info[:2], platform.machine()])
                         .encode()).hexdigest()[:12]
    directory = Path("/tmp/skyward-test-wheelhouse") / key
    if (directory / ".complete").exists():
        return str(directory)
    staging = directory.with_name(f"{key}.{os.getpid()}.partial")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", str(staging), *requirements],
        capture_output=True, text=True, timeout=300,
    )
    if proc.returncode != 0:
        pytest.fail("cannot download the test wheelhouse (needs a package index on this machine):\n"
                    + proc.stderr[-2000:])
    (staging / ".complete").touch()
    try:
        staging.rename(directory)
    except OSError:  # another session finished first
        subprocess.run(["rm", "-rf", str(staging)], check=False)
    return str(directory)


def ssh_provider(hosts: list[testhosts.TestHost], wheelhouse: str, **overrides) -> sky.SSH:
    """An SSH provider for ``hosts`` that verifies host keys and installs from the wheelhouse."""
    options = dict(user=hosts[0].user, key=hosts[0].key_path, known_hosts=hosts[0].known_hosts_all,
                   find_links=[wheelhouse], no_index=True, connect_timeout=5)
    options.update(overrides)
    return sky.SSH([h.ip for h in hosts], **options)


#: Ubuntu's default ~/.bashrc begins so: a bash that is not interactive returns at once.
UBUNTU_GUARD = "case $- in *i*) ;; *) return;; esac\n"


@contextlib.contextmanager
def kept_bashrcs(hosts: list[testhosts.TestHost], text: str = UBUNTU_GUARD) -> Iterator[None]:
    """Each host's ~/.bashrc holds ``text`` (default: Ubuntu's guard) inside the block, and what
    it held before afterwards (the hosts live for the whole session)."""
    rcs = [Path(h.home) / ".bashrc" for h in hosts]
    kept = [rc.read_text() if rc.exists() else None for rc in rcs]
    for rc in rcs:
        rc.write_text(text)
    try:
        yield
    finally:
        for rc, before in zip(rcs, kept, strict=True):
            if before is None:
                rc.unlink(missing_ok=True)
            else:
                rc.write_text(before)


def venv_site_env(*modules: str) -> dict[str, str]:
    """Image env that lets the hosts import ``modules`` from the client's virtual environment.

    The hosts' environments are made from the base interpreter, which sees its own packages
    (``system_site_packages``) but not a venv's; when pytest runs in a venv that holds these
    modules (a fresh ``python3 -m venv``, under /tmp which the hosts share), their directory
    goes on the hosts' ``PYTHONPATH``. Empty otherwise.
    """
    import importlib.util

    if sys.prefix == sys.base_prefix:
        return {}
    dirs = []
    for module in modules:
        spec = importlib.util.find_spec(module)
        origin = spec.origin if spec is not None else None
        if origin and origin.startswith(sys.prefix + os.sep):
            site = os.path.dirname(os.path.dirname(origin))
            if site not in dirs:
                dirs.append(site)
    return {"PYTHONPATH": os.pathsep.join(dirs)} if dirs else {}

