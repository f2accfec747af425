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


def program(code: str, home: str) -> subprocess.CompletedProcess[str]:
    """A fresh interpreter running ``code``, then ``python -m skyward.cli --version`` in it."""
    script = code + "\nimport runpy, sys\nsys.argv = ['skyward', '--version']\nrunpy.run_module('skyward.cli', run_name='__main__')\n"
    return subprocess.run([sys.executable, "-c", script], env=dict(os.environ, SKYWARD_HOME=home),
                          capture_output=True, text=True, timeout=120)


def test_the_command_ends_without_the_interpreters_teardown_once_its_output_is_out(tmp_path):
    # `skyward exec NAME true` spent ~30 ms after its command had returned in the interpreter's
    # teardown (freeing every module, joining paramiko's threads): the program ends at once.
    # The atexit handlers still run (a pool left open closes itself from one); the objects of
    # the modules are not freed one by one.
    done = program("import atexit\natexit.register(print, 'atexit ran')\nclass Kept:\n"
                   "    def __del__(self):\n        print('freed one by one', flush=True)\nkept = Kept()",
                   str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("skyward ")  # (its output is out, flushed before the end)
    assert "atexit ran" in done.stdout and "freed one by one" not in done.stdout, done.stdout
    # A thread that is not a daemon is still waited for, as Python does.
    waited = program("import threading, time\nthreading.Thread(target=lambda: (time.sleep(0.2), "
                     "print('thread ended', flush=True))).start()", str(tmp_path))
    assert waited.returncode == 0 and waited.stdout.splitlines()[-1] == "thread ended", waited.stdout
