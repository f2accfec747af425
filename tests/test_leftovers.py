"""The suite's own hygiene (tests/leftovers.py): a test session that leaves a skyward worker
running says so loudly, fails, and ends it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from skyward.clusters import manage
from tests.conftest import wait_gone
from tests.leftovers import SESSION_VAR, cluster_home

ROOT = Path(__file__).resolve().parent.parent

LEAKS = """
import skyward as sky

def test_leaves_a_named_cluster_up():
    with sky.ComputePool(name="leak", nodes=1, console=False):
        pass  # a named cluster outlives its block, and nothing ends it
"""


def test_a_session_that_leaves_a_worker_running_fails_loudly_and_ends_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "test_leaks.py").write_text(LEAKS)
    with cluster_home(monkeypatch, "skyl") as home:
        env = {k: v for k, v in os.environ.items() if k != SESSION_VAR}  # a session of its own
        env.update(PYTHONPATH=str(ROOT), SKYWARD_HOME=home, SKYWARD_TEST_SETTLE="1")
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
                               str(tmp_path / "test_leaks.py")], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=300)
        [record] = manage.ClusterStore().all()
        pids = [pid for pid, _ in record.workers]
        assert done.returncode == 1, done.stdout + done.stderr
        assert "1 passed" in done.stdout
        assert "SKYWARD TEST SESSION LEFT" in done.stderr and f"pid {pids[0]}:" in done.stderr, done.stderr
        assert wait_gone(pids, 10) == [], "the worker left behind was not ended"
