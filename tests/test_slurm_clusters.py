"""Named clusters, their jobs and elastic pools on a real Slurm (tests/slurm_cluster.py): the
allocation is the cluster, its workers are job steps that outlive the client, and a later
process reaches them through a new step on the node.

After every test Slurm runs no job of ours and no worker is left on any node."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import skyward as sky
from skyward import events as ev
from skyward.clusters import manage
from tests import leftovers, slurm_cluster
from tests.conftest import pid_alive

pytestmark = slurm_cluster.needs_slurm
slurm, nothing_left = slurm_cluster.slurm, slurm_cluster.nothing_left  # (the shared fixtures)

ROOT = str(Path(__file__).resolve().parents[1])


@pytest.fixture
def own_home(monkeypatch) -> Iterator[str]:
    with leftovers.cluster_home(monkeypatch, "skyslc") as path:
        yield path


@sky.compute
def node_and_pid() -> tuple[str | None, int]:
    import os

    return os.environ.get("SLURMD_NODENAME"), os.getpid()


def skyward(*args: str) -> subprocess.CompletedProcess[str]:
    """The ``skyward`` command, in a process of its own (this test's home and Slurm)."""
    return subprocess.run([sys.executable, "-m", "skyward.cli", *args], env={**os.environ, "PYTHONPATH": ROOT},
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def job_ids(slurm) -> list[str]:
    return [line.split()[0] for line in slurm.jobs()]


ATTACH = """
import skyward as sky

@sky.compute
def node_and_pid():
    import os
    return os.environ.get("SLURMD_NODENAME"), os.getpid()

with sky.ComputePool(name="kept", console=False) as pool:
    print(node_and_pid() @ pool)
"""


def test_a_named_cluster_outlives_its_client_another_process_attaches_and_down_cancels_it(slurm, own_home) -> None:
    with sky.ComputePool(provider=sky.Slurm(partition=slurm.partition), nodes=2, name="kept", idle_minutes=10,
                         console=False) as pool:
        workers = node_and_pid() @ pool
    assert [node for node, _ in workers] == slurm.nodes
    assert [line.split()[2] for line in slurm.jobs()] == ["RUNNING"]  # the allocation stays: it is the cluster
    assert all(pid_alive(pid) for _, pid in workers)
    attached = subprocess.run([sys.executable, "-c", ATTACH], env={**os.environ, "PYTHONPATH": ROOT},
                              capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert attached.returncode == 0, attached.stderr
    assert ast.literal_eval(attached.stdout.strip()) == workers  # the same worker processes
    shown = skyward("status", "--json")
    assert [(c["name"], c["provider"], c["status"]) for c in json.loads(shown.stdout)] == [("kept", "slurm", "UP")]
    ended = skyward("down", "kept")
    assert ended.returncode == 0, ended.stderr
    assert slurm.jobs() == [] and slurm.wait_workers_gone() == []  # confirmed before `down` returned
    assert manage.status() == []


def test_an_allocation_slurm_ended_shows_stopped_and_the_next_pool_gets_a_new_one(slurm, own_home) -> None:
    with sky.ComputePool(provider=sky.Slurm(partition=slurm.partition), nodes=1, name="ended",
                         console=False) as pool:
        [(_, before)] = node_and_pid() @ pool
    [job] = job_ids(slurm)
    slurm.run("scancel", job)  # (an admin, or the time limit)
    assert slurm.wait_jobs_gone() == [] and slurm.wait_workers_gone() == []
    assert [c.status for c in manage.status(["ended"])] == ["STOPPED"]
    with sky.ComputePool(name="ended", console=False) as pool:
        [(_, after)] = node_and_pid() @ pool
        assert after != before and job_ids(slurm) != [job] and len(job_ids(slurm)) == 1
        pool.down()


def test_stop_releases_the_allocation_keeps_the_record_and_start_asks_slurm_again(slurm, own_home) -> None:
    with sky.ComputePool(provider=sky.Slurm(partition=slurm.partition, time="20:00"), nodes=2, name="paused",
                         console=False) as pool:
        before = node_and_pid() @ pool
    [job] = job_ids(slurm)
    stopped = skyward("stop", "paused")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert slurm.jobs() == [] and slurm.wait_workers_gone() == []  # released, confirmed before `stop` returned
    assert [c.status for c in manage.status(["paused"])] == ["STOPPED"]  # the record stays
    started = skyward("start", "paused")
    assert started.returncode == 0, started.stdout + started.stderr
    [again] = slurm.run("squeue", "-h", "-o", "%i %P %D %l").stdout.split("\n")[:1]
    assert again.split()[0] != job and again.split()[1:] == [slurm.partition, "2", "20:00"]  # the same request
    with sky.ComputePool(name="paused", console=False) as pool:
        after = node_and_pid() @ pool
        assert [node for node, _ in after] == slurm.nodes and {p for _, p in after}.isdisjoint(p for _, p in before)
    assert manage.down("paused") == []


def test_autostop_releases_the_allocation(slurm, own_home) -> None:
    with sky.ComputePool(provider=sky.Slurm(partition=slurm.partition), nodes=1, name="idle", idle_minutes=0.02,
                         console=False) as pool:
        [(_, pid)] = node_and_pid() @ pool
    assert slurm.wait_jobs_gone() == [], "the idle cluster's allocation was not released"
    assert not pid_alive(pid)
    assert [c.status for c in manage.status(["idle"])] == ["STOPPED"]
    assert manage.down("idle") == []


def test_exec_runs_a_job_on_the_allocation_and_queue_lists_it(slurm, own_home) -> None:
    with sky.ComputePool(provider=sky.Slurm(partition=slurm.partition), nodes=2, name="jobs", console=False):
        pass
    ran = skyward("exec", "jobs", "echo on $SLURMD_NODENAME in $SLURM_JOB_ID")
    assert ran.returncode == 0, ran.stderr
    assert re.findall(r"^Job ID: (\d+)$", ran.stdout, re.M) == ["1"]
    [allocation] = job_ids(slurm)
    assert f"on {slurm.nodes[0]} in {allocation}" in ran.stdout
    listed = skyward("queue", "jobs", "--json")
    assert [(j["id"], j["status"]) for j in json.loads(listed.stdout)["jobs"]] == [(1, "SUCCEEDED")]
    assert manage.down("jobs") == []


@sky.compute
def pause_then(value: int, seconds: float) -> int:
    import time

    time.sleep(seconds)
    return value


def test_an_elastic_pool_grows_by_an_allocation_under_queued_work_and_releases_it_when_idle(slurm) -> None:
    changed = threading.Condition()
    events: list[ev.Event] = []
    grown: list[list[str]] = []  # Slurm's jobs as the pool grew

    def on_event(event: ev.Event) -> None:
        if isinstance(event, ev.NodeAdded):
            grown.append(job_ids(slurm))
        if isinstance(event, (ev.NodeAdded, ev.NodeRemoved)):
            with changed:
                events.append(event)
                changed.notify_all()

    def wait_for(kind: type) -> ev.Event:
        with changed:
            assert changed.wait_for(lambda: any(isinstance(e, kind) for e in events), 60), f"no {kind.__name__}"
            return next(e for e in events if isinstance(e, kind))

    with sky.ComputePool(provider=sky.Slurm(partition=slurm.partition), nodes=(1, 2), scale_up_after=0.5,
                         scale_down_after=1.0, console=False, on_event=on_event) as pool:
        [first] = job_ids(slurm)
        assert pool.map(lambda i: pause_then.fn(i, 0.5), range(8)) == list(range(8))
        added = wait_for(ev.NodeAdded)
        assert added.node == 1 and len(grown[0]) == 2 and first in grown[0]  # one more allocation
        wait_for(ev.NodeRemoved)
        assert len(pool.instances) == 1
        assert job_ids(slurm) == [pool.instances[0].id.split("-")[1]]  # the idle node's allocation released
