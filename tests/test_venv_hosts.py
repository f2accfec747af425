"""Test hosts get the interpreter and packages a test intends, also when pytest runs inside a
virtual environment: a pool that takes packages from the host's Python sees that
environment's own packages, not only those of the interpreter it was made from."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.conftest import venv_seeing_this_environment
from tests.hosts import testhosts

ROOT = Path(__file__).resolve().parents[1]


def make_venv(where: Path, package: str) -> Path:
    """A virtual environment of this interpreter (seeing its packages) that alone has ``package``.

    ``venv --system-site-packages`` alone is not enough when this interpreter is itself a
    virtual environment's (the README's ``python3 -m venv``): the new one is made from the base
    interpreter and sees the base's packages, not this environment's (pytest, paramiko):
    :func:`tests.conftest.venv_seeing_this_environment` adds them.
    """
    python = venv_seeing_this_environment(where)
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             check=True, capture_output=True, text=True).stdout.strip()
    (Path(purelib) / package).mkdir()
    (Path(purelib) / package / "__init__.py").write_text("")
    info = Path(purelib) / f"{package}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 1.0\n")
    (info / "RECORD").write_text("")
    return python


def test_a_pool_on_hosts_made_from_a_venv_sees_the_venvs_packages(tmp_path) -> None:
    if testhosts.unavailable_reason():
        pytest.skip(str(testhosts.unavailable_reason()))
    package = f"skyward_venv_probe_{uuid.uuid4().hex[:8]}"
    python = make_venv(tmp_path / "venv", package)  # (under /tmp, which the hosts share)
    proc = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/hosts/probe_in_venv.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, SKYWARD_VENV_PROBE=package, TEST_HOSTS_N="1"),
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout
