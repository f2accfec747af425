"""Managed jobs whose controller runs on an SSH test host (``SKYWARD_JOBS_CONTROLLER`` names a
one-node named cluster on host 0) and whose clusters are made from there on host 1: the client
SIGKILLed after submitting and the controller SIGKILLed mid-job (the next ask starts it again and
it finishes the job), and host 1's link cut mid-job (RECOVERING, then SUCCEEDED on a new cluster).
Afterwards the controller's node knows no cluster, and no skyward process is left on host 1."""

from __future__ import annotations

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
from skyward.jobs import client
from skyward.jobs.store import FINAL
from skyward.jobs.remote import VARIABLE, controller_home
from tests.hosts.conftest_fixture import ssh_provider
from tests.hosts.testhosts import TestHost
from tests.leftovers import cluster_home
from tests.test_cluster_cli import ROOT
from tests.test_cluster_jobs import until

CONTROLLER = "skyward.jobs.controller"


@sky.compute
def held(folder: str) -> int:
    """Notes its run, then waits for ``go``; returns how many runs there were."""
    Path(folder, f"run.{os.getpid()}").touch()
    while not Path(folder, "go").exists():
        Path(folder, "alive").touch()
        time.sleep(0.05)
    return len(list(Path(folder).glob("run.*")))


@pytest.fixture
def remote(monkeypatch: pytest.MonkeyPatch, test_hosts: list[TestHost], wheelhouse: str) -> Iterator[Path]:
    """A client home with the controller's cluster on host 0 (``VARIABLE`` set); yields the
    controller's skyward home on host 0 (as this machine sees it). The controller ended after."""
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


def shared_folder() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="skyrem", dir="/tmp"))  # (the hosts' users write here)
    os.chmod(folder, 0o777)
    return folder


def running(job: int, folder: Path) -> bool:
    """Whether job ``job`` runs (its call has started); AssertionError once it has ended."""
    status = sky.jobs.get(job).status
    assert status not in FINAL, f"job {job} ended {status}: {client.get(job).reason}"
    return status == "RUNNING" and (folder / "alive").exists()


def controller_pids(host: TestHost) -> list[int]:
    return host.processes(CONTROLLER)


def nothing_left(controller: Path, node: TestHost) -> None:
    """The controller's node knows no cluster; no skyward process runs on the job's host."""
    assert ClusterStore(controller / "state.db").all() == []
    until(lambda: node.processes("skyward") == [], 30, "the job's processes on its host to end")


def test_the_job_outlives_its_killed_client_and_its_killed_controller(remote: Path, test_hosts: list[TestHost],
                                                                       wheelhouse: str, tmp_path: Path) -> None:
    control, node = test_hosts[0], test_hosts[1]
    folder = shared_folder()
    (tmp_path / "provider").write_bytes(pickle.dumps(ssh_provider([node], wheelhouse)))
    script = ("import pickle, sys, time, skyward as sky\nfrom tests.test_managed_remote import held\n"
              "provider = pickle.loads(open(sys.argv[1], 'rb').read())\n"
              "print(sky.jobs.launch(held(sys.argv[2]), provider=provider).id, flush=True)\ntime.sleep(600)\n")
    client = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "provider"), str(folder)], cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, text=True)
    try:
        assert client.stdout is not None
        job = int(client.stdout.readline())
    finally:
        client.send_signal(signal.SIGKILL)
        client.wait()
    assert job == 1
    until(lambda: running(job, folder), 60, "the job to run on host 1")
    assert sky.jobs.get(job).status == "RUNNING" and [j.id for j in sky.jobs.list()] == [job]
    first = controller_pids(control)
    assert len(first) == 1
    os.kill(first[0], signal.SIGKILL)
    (folder / "go").touch()
    assert sky.jobs.get(job).result(timeout=60) == 1  # (the next ask started a controller: it finished the job)
    second = controller_pids(control)
    assert len(second) == 1 and second != first
    assert sky.jobs.get(job).status == "SUCCEEDED"
    nothing_left(remote, node)


def test_a_job_host_cut_mid_job_is_recovered_and_succeeds(remote: Path, test_hosts: list[TestHost],
                                                          wheelhouse: str) -> None:
    node = test_hosts[1]
    folder = shared_folder()
    job = sky.jobs.launch(held(str(folder)), provider=ssh_provider([node], wheelhouse))
    until(lambda: running(job.id, folder), 60, "the job to run on host 1")
    node.set_link(False)
    try:
        until(lambda: job.status == "RECOVERING", 60, "the controller to see host 1 lost")
    finally:
        node.set_link(True)
    until(lambda: len(list(folder.glob("run.*"))) == 2, 60, "the job to run again on a new cluster")
    (folder / "go").touch()
    assert job.result(timeout=60) == 2
    assert [j.status for j in sky.jobs.list()] == ["SUCCEEDED"]
    assert client.get(job.id).recoveries == 1
    nothing_left(remote, node)
