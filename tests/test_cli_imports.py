"""The ``skyward`` command starts at once: ``--help``, ``status`` and ``queue`` import none of
the heavy packages (paramiko, boto3, pydantic, torch)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

HEAVY = ("paramiko", "boto3", "botocore", "pydantic", "torch")


def imported_by(args: list[str], home: str) -> set[str]:
    """Every module ``python -m skyward.cli *args`` imports (from ``-X importtime``)."""
    env = dict(os.environ, SKYWARD_HOME=home)
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "skyward.cli", *args], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    return {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}


@pytest.mark.parametrize("args", [["--help"], ["status"], ["queue"]], ids=lambda a: " ".join(a))
def test_the_quick_commands_import_no_heavy_package(args, tmp_path):
    modules = imported_by(args, str(tmp_path))
    assert "skyward.cli.main" in modules
    heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY)
    assert heavy == [], f"skyward {' '.join(args)} imports {heavy[:10]}"
