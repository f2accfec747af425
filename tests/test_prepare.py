"""Host preparation is one step that works through any Transport: here the Local transport
builds an environment on this machine exactly as it would on an SSH host."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import skyward as sky
from skyward.pool.prepare import prepare
from skyward.providers.base import HostEnvironment, Instance
from skyward.transport.local import LocalTransport


def test_a_host_python3_that_is_a_venv_lends_its_own_packages(tmp_path: Path, wheelhouse: str, monkeypatch) -> None:
    # The python3 a login shell finds is a venv holding a package its base interpreter lacks.
    venv = tmp_path / "host-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python*/site-packages"))
    (site / "only_in_the_host_venv.py").write_text("WHERE = 'the host venv'\n")
    monkeypatch.setenv("PATH", f"{venv}/bin{os.pathsep}{os.environ['PATH']}")
    root = tmp_path / "root"
    instance = Instance("here", 0, "127.0.0.1", environment=HostEnvironment(
        root=str(root), find_links=(wheelhouse,), no_index=True, system_site_packages=("numpy",)))
    log: list[str] = []

    launch = prepare(instance, LocalTransport(), sky.Image(), log.append)

    assert "::step:: venv" in log and launch.argv[0] == "bash"
    (python,) = root.glob("envs/*/bin/python")
    done = subprocess.run([str(python), "-c", "import only_in_the_host_venv as m, skyward; print(m.WHERE)"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "the host venv"
