"""Managed jobs from Python (``sky.jobs.launch``) on the Local provider: a broadcast call on 2
nodes that checkpoints comes back with its result after one of its nodes is SIGKILLed (the job
recovered on a new cluster), from another process too; a call that raises gives its exception;
cancel, list and unknown ids; two first submits at once from two processes share one controller,
which exits by itself once idle. Afterwards no cluster and no process of the job is left."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import skyward as sky
from skyward.clusters.state import ClusterStore
from skyward.jobs import client
from skyward.jobs.controller import IDLE_VARIABLE
from tests.conftest import wait_gone
from tests.test_cluster_cli import ROOT
from tests.test_cluster_jobs import until
from tests.test_managed_jobs import home, home_processes, nothing_left  # noqa: F401 (home: a fixture)


@sky.compute
def resumable(out: str) -> tuple[int, str]:
    """Each node: where it resumes from (node 0 checkpoints "1"), then waits for "go"."""
    folder = Path(out)
    node = sky.instance_info().node
    start = (folder / "ckpt").read_text() if (folder / "ckpt").exists() else "0"
    if node == 0:
        (folder / "ckpt").write_text("1")
    (folder / f"node{node}.{os.getpid()}").write_text(start)
    while not (folder / "go").exists():
        time.sleep(0.05)
    print(f"node {node} resumed at {start}")
    return node, start


@sky.compute
def fails(out: str) -> None:
    Path(out, "failed").write_text("ran")
    raise KeyError("no such shard")


@sky.compute
def fails_once(out: str) -> str:
    tried = Path(out, "tried")
    if not tried.exists():
        tried.write_text("1")
        raise RuntimeError("a flaky first run")
    return "second run"


def test_recovery_restarts_a_failed_call_as_a_task_files_job_recovery_does(home: str, tmp_path: Path) -> None:
    job = sky.jobs.launch(fails_once(str(tmp_path)), recovery={"max_restarts_on_errors": 1})
    assert job.result(timeout=60) == "second run"
    assert (client.get(job.id).status, client.get(job.id).restarts) == ("SUCCEEDED", 1)
    for bad, match in [({"max_restarts_on_errors": -1}, "invalid recovery.max_restarts_on_errors: expected a "
                                                        "whole number >= 0, got -1"),
                       ("SOMETIMES", "invalid recovery.strategy: expected one of EAGER_NEXT_REGION, FAILOVER, NONE"),
                       ({"max_restart": 1}, "invalid recovery.max_restart: .*did you mean 'max_restarts_on_errors'")]:
        with pytest.raises(sky.ConfigError, match=match):
            sky.jobs.launch(fails_once(str(tmp_path)), recovery=bad)
    with pytest.raises(sky.ConfigError, match="invalid max_restarts_on_errors: expected None when recovery= is given"):
        sky.jobs.launch(fails_once(str(tmp_path)), recovery="FAILOVER", max_restarts_on_errors=1)
    assert [j.id for j in sky.jobs.list()] == [job.id]  # (bad input recorded nothing)
    nothing_left(home)


def test_a_broadcast_call_survives_a_lost_node_and_its_result_comes_back(home: str, tmp_path: Path) -> None:
    job = sky.jobs.launch(resumable(str(tmp_path)), nodes=2, broadcast=True, provider=sky.Local())
    assert isinstance(job, sky.Job) and (job.id, job.name) == (1, "resumable")
    until(lambda: len(list(tmp_path.glob("node*"))) == 2 and job.status == "RUNNING", 60, "both nodes to run")
    workers = ClusterStore().get(job.cluster).workers
    os.kill(workers[1][0], signal.SIGKILL)  # node 1's worker, and the call with it
    until(lambda: sky.jobs.get(job.id).status == "RUNNING" and len(list(tmp_path.glob("node*"))) == 4, 60,
          "the job to run again on a new cluster")
    with pytest.raises(sky.JobTimeout, match="not finished within 0s"):
        job.result(timeout=0)
    (tmp_path / "go").touch()
    assert job.result(timeout=60) == [(0, "1"), (1, "1")]  # resumed from the checkpoint, every node
    assert job.status == "SUCCEEDED" and [j.id for j in sky.jobs.list()] == [1]
    other = subprocess.run([sys.executable, "-c", "import skyward as sky; print(sky.jobs.get(1).result(5))"],
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60)
    assert other.stdout.strip() == "[(0, '1'), (1, '1')]", other.stderr
    assert "node 1 resumed at 1" in job.logs()
    said = io.StringIO()
    client.logs(1, said, follow=False, of_controller=True)
    assert "RECOVERING: a node was lost" in said.getvalue() and client.get(1).recoveries == 1
    nothing_left(home)


def test_a_raising_call_fails_with_its_exception_and_a_cancelled_one_has_no_result(home: str, tmp_path: Path) -> None:
    failed = sky.jobs.launch(fails(str(tmp_path)))
    with pytest.raises(KeyError, match="no such shard") as raised:
        failed.result(timeout=60)
    assert "remote traceback" in "".join(getattr(raised.value, "__notes__", [])).lower()
    assert failed.status == "FAILED"
    held = sky.jobs.launch(resumable(str(tmp_path / "held")))
    (tmp_path / "held").mkdir()
    until(lambda: held.status == "RUNNING", 60, "the job to run")
    held.cancel()
    assert held.status == "CANCELLED"
    with pytest.raises(sky.JobError, match="was cancelled: it has no result"):
        held.result()
    with pytest.raises(sky.JobError, match=r"has already finished \(CANCELLED\)"):
        held.cancel()
    with pytest.raises(sky.ConfigError, match="expected a managed job's id .one of 1, 2"):
        sky.jobs.get(9)
    with pytest.raises(sky.ConfigError, match="invalid nodes"):
        sky.jobs.launch(fails(str(tmp_path)), nodes=0)
    nothing_left(home)


@sky.compute
def square(x: int) -> int:
    return x * x


AT_ONCE = """
import os, sys, time
import skyward as sky
from skyward.jobs import controller
from tests.test_managed_calls import square

ready, go = sys.argv[1], sys.argv[2]
open(ready, "w").close()
while not os.path.exists(go):  # (both processes start their first submit on the same event)
    time.sleep(0.002)
job = sky.jobs.launch(square(int(sys.argv[3])))
print(job.id, controller.running(), flush=True)
"""


def test_two_first_submits_at_once_share_one_controller_which_exits_once_idle_after_both_succeed(
        home: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), IDLE_VARIABLE: "1"}  # (read by the controller as it starts)
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", AT_ONCE, str(tmp_path / f"ready{n}"), str(go), str(n)],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for n in (2, 3)]
    until(lambda: all((tmp_path / f"ready{n}").exists() for n in (2, 3)), 60, "both clients to be ready")
    go.touch()
    answers = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [a[1][-2000:] for a in answers]
    (first, leader), (second, other) = [tuple(map(int, out.split())) for out, _ in answers]
    assert sorted([first, second]) == [1, 2] and leader == other  # one controller, both jobs in its queue
    assert sky.jobs.get(first).result(timeout=120) == 4 and sky.jobs.get(second).result(timeout=120) == 9
    until(lambda: all(client.get(j).cleaned for j in (first, second)), 60, "the jobs' clusters to be torn down")
    assert wait_gone([leader], 60) == [], "the controller did not exit once idle"
    log = (Path(home) / "managed" / "controller.log").read_text()
    assert log.count(" started") == 1 and f"controller pid {leader} exits (no job for 1s)" in log, log
    assert ClusterStore().all() == [] and until(lambda: home_processes(home) == [], 30, "every process to end")

