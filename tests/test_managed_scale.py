"""The managed jobs' controller under load, on the Local provider: its loop never waits on one
job's cluster (a look that hangs leaves the other jobs going), and 50 tiny jobs submitted at
once all end SUCCEEDED with their clusters gone. bench/managed_jobs.py takes the second to 200
jobs and measures."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from skyward.clusters.state import ClusterStore
from skyward.jobs import client, controller
from skyward.launch import plan as load_plan
from tests.test_cluster_jobs import until
from tests.test_managed_jobs import HELD, home, nothing_left, state, submit  # noqa: F401 (home: a fixture)

THREE_NODES = "num_nodes: 3\n" + HELD


def test_a_hanging_look_at_one_job_does_not_hold_up_the_others(home: str, tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    stuck = submit(tmp_path / "a", THREE_NODES)
    until(lambda: state(stuck) == "RUNNING", 60, "job 1 to run")
    (tmp_path / "b").mkdir()
    other = submit(tmp_path / "b")
    until(lambda: state(other) == "RUNNING", 60, "job 2 to run")
    workers = [pid for pid, _ in ClusterStore().get(f"sky-managed-{stuck}").workers]
    for pid in workers:  # every node of job 1 stops answering: a look at it waits 5 s per node
        os.kill(pid, signal.SIGSTOP)
    try:
        (tmp_path / "b" / "out" / "go").touch()
        until(lambda: state(other) == "SUCCEEDED", 60, "job 2 to end")
        # job 2 ended while the look at job 1 still waited on its nodes
        assert (state(stuck), client.get(stuck).recoveries) == ("RUNNING", 0)
    finally:
        for pid in workers:
            os.kill(pid, signal.SIGCONT)
    assert [j.status for j in client.cancel([stuck])] == ["CANCELLED"]
    nothing_left(home)


def test_fifty_jobs_submitted_at_once_all_succeed_and_leave_nothing(home: str, tmp_path: Path) -> None:
    (tmp_path / "tiny.yaml").write_text("name: tiny\nrun: echo done\n")
    plan = load_plan(str(tmp_path / "tiny.yaml"), env=[f"OUT={tmp_path}"])
    ids = [client.submit(plan) for _ in range(50)]
    ended = [client.wait(job, 300) for job in ids]
    assert {j.status for j in ended} == {"SUCCEEDED"}, [(j.id, j.status, j.reason) for j in ended]
    nothing_left(home)
