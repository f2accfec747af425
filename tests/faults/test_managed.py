"""Managed jobs through a fault, their controller on an SSH test host (``SKYWARD_JOBS_CONTROLLER``
names a one-node named cluster on host 0) and their clusters made from there on host 1
(:data:`CASES`; ``scripts/reliability.py`` puts them on docs/reliability.md):

* ``client-and-controller-killed``: the client is SIGKILLed as soon as it has printed the job's
  id, then the controller mid-job; the next ask starts a controller, which finishes the job;
* ``job-host-cut``: host 1's link is cut mid-job: the job is RECOVERING, then (the link back)
  SUCCEEDED on a new cluster, after one recovery.

Afterwards the controller's node knows no cluster, and no skyward process is left on host 1."""

from __future__ import annotations

import io
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import skyward as sky
from skyward.clusters.state import ClusterStore
from skyward.errors import ConfigError
from skyward.jobs import client
from skyward.jobs.store import FINAL
from skyward.jobs.remote import VARIABLE, controller_home
from tests.hosts.conftest_fixture import ssh_provider
from tests.hosts.testhosts import TestHost
from tests.leftovers import cluster_home
from tests.test_cluster_cli import ROOT
from tests.test_cluster_jobs import until

CONTROLLER = "skyward.jobs.controller"
CASES = ("client-and-controller-killed", "job-host-cut")
TEST = "test_a_managed_job_through_a_fault"


@sky.compute
def held(folder: str) -> int:
    """Notes its run, then waits for ``go``; returns how many runs there were."""
    Path(folder, f"run.{os.getpid()}").touch()
    print(f"run in {os.getpid()}", flush=True)
    while not Path(folder, "go").exists():
        Path(folder, "alive").touch()
        time.sleep(0.05)
    return len(list(Path(folder).glob("run.*")))


@pytest.fixture
def remote(monkeypatch: pytest.MonkeyPatch, test_hosts: list[TestHost], wheelhouse: str) -> Iterator[Path]:
    """A client home with the controller's cluster on host 0 (``VARIABLE`` set); yields the
    controller's skyward home on host 0 (as this machine sees it). The controller ended after,
    and any cluster it left (a failed test's) ended from here, with its records."""
    host = test_hosts[0]
    with cluster_home(monkeypatch, "skyr"):
        # (the controller makes SSH connections: its environment sees the host's paramiko)
        provider = ssh_provider([host], wheelhouse, system_site_packages=True)
        with sky.ComputePool(name="jctl", provider=provider, console=False):
            pass
        record = ClusterStore().get("jctl")
        assert record is not None
        monkeypatch.setenv(VARIABLE, "jctl")
        where = Path(host.home) / controller_home(record).removeprefix("~/")
        try:
            yield where
        finally:
            for log in sorted(where.glob("managed/**/*.log")):  # (shown when the test fails)
                print(f"--- {log}:\n{log.read_text(errors='replace')[-3000:]}")
            host.kill_processes(CONTROLLER)
            host.kill_processes("skyward.jobs.launcher")
            if ClusterStore(where / "state.db").all():
                subprocess.run([sys.executable, "-m", "skyward.cli", "down", "-a", "-y"], cwd=ROOT, timeout=120,
                               env={**os.environ, "PYTHONPATH": str(ROOT), "SKYWARD_HOME": str(where)}, check=False)


def shared_folder() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="skyrem", dir="/tmp"))  # (the hosts' users write here)
    os.chmod(folder, 0o777)
    return folder


def running(job: int, folder: Path) -> bool:
    """Whether job ``job`` runs (its call has started); AssertionError once it has ended."""
    status = client.get(job).status
    assert status not in FINAL, f"job {job} ended {status}: {client.get(job).reason}"
    return status == "RUNNING" and (folder / "alive").exists()


def controller_pids(host: TestHost) -> list[int]:
    return host.processes(CONTROLLER)


def nothing_left(controller: Path, node: TestHost) -> None:
    """The controller's node knows no cluster; no skyward process runs on the job's host."""
    assert ClusterStore(controller / "state.db").all() == []
    until(lambda: node.processes("skyward") == [], 30, "the job's processes on its host to end")


@pytest.mark.parametrize("case", CASES)
def test_a_managed_job_through_a_fault(case: str, remote: Path, test_hosts: list[TestHost], wheelhouse: str,
                                       tmp_path: Path) -> None:
    control, node = test_hosts[0], test_hosts[1]
    folder = shared_folder()
    provider = ssh_provider([node], wheelhouse, connect_timeout=2)  # (a cut host is found lost sooner)
    if case == "client-and-controller-killed":
        job = submitted_by_a_killed_client(provider, folder, tmp_path)
    else:
        job = sky.jobs.launch(held(str(folder)), provider=provider).id
    assert job == 1
    until(lambda: running(job, folder), 60, "the job to run on host 1")
    first = controller_pids(control)
    assert len(first) == 1
    if case == "client-and-controller-killed":
        os.kill(first[0], signal.SIGKILL)
    else:
        node.set_link(False)
        try:
            until(lambda: client.get(job).status == "RECOVERING", 60, "the controller to see host 1 lost")
        finally:
            node.set_link(True)
        until(lambda: len(list(folder.glob("run.*"))) == 2, 60, "the job to run again on a new cluster")
    (folder / "go").touch()
    runs = 1 if case == "client-and-controller-killed" else 2
    assert sky.jobs.get(job).result(timeout=60) == runs  # (a killed controller: the next ask started one)
    assert [(j.id, j.status, j.recoveries) for j in client.jobs()] == [(job, "SUCCEEDED", runs - 1)]
    second = controller_pids(control)
    assert len(second) == 1 and (second != first) == (case == "client-and-controller-killed")
    nothing_left(remote, node)
    if case == "client-and-controller-killed":  # (the other asks, once: logs streamed, an error with its type)
        out = io.StringIO()
        assert client.logs(job, out, follow=True).status == "SUCCEEDED"
        assert out.getvalue().count("run in ") == 1, out.getvalue()
        with pytest.raises(ConfigError, match="a managed job that has not finished \\(job 1 is SUCCEEDED\\)"):
            client.cancel([job])


def test_skyward_jobs_cancel_from_another_process_ends_a_job_on_the_hosts_controller(
        remote: Path, test_hosts: list[TestHost], wheelhouse: str) -> None:
    node = test_hosts[1]
    folder = shared_folder()
    job = sky.jobs.launch(held(str(folder)), provider=ssh_provider([node], wheelhouse)).id
    until(lambda: running(job, folder), 60, "the job to run on host 1")
    assert node.processes("skyward") != []
    cancelled = subprocess.run([sys.executable, "-m", "skyward.cli", "jobs", "cancel", str(job), "-y"], cwd=ROOT,
                               env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                               timeout=180)
    assert (cancelled.returncode, cancelled.stdout) == (0, f"managed job {job} CANCELLED\n"), cancelled.stderr
    assert [(j.id, j.status, j.cleaned) for j in client.jobs()] == [(job, "CANCELLED", True)]
    nothing_left(remote, node)  # (its cluster gone from the controller's records, no process on host 1)


def submitted_by_a_killed_client(provider: sky.SSH, folder: Path, tmp_path: Path) -> int:
    """``sky.jobs.launch`` in a program SIGKILLed as soon as it has printed the job's id."""
    (tmp_path / "provider").write_bytes(pickle.dumps(provider))
    script = ("import pickle, sys, time, skyward as sky\nfrom tests.faults.test_managed import held\n"
              "provider = pickle.loads(open(sys.argv[1], 'rb').read())\n"
              "print(sky.jobs.launch(held(sys.argv[2]), provider=provider).id, flush=True)\ntime.sleep(600)\n")
    program = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "provider"), str(folder)], cwd=ROOT,
                               env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, text=True)
    try:
        assert program.stdout is not None
        return int(program.stdout.readline())
    finally:
        program.send_signal(signal.SIGKILL)
        program.wait()
