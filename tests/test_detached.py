"""Detached calls on a named cluster (Local): ``pool.spawn`` puts a call in the cluster's job
queue, it outlives its client (a real second process, SIGKILLed), and any later process collects
its result, its exception, or a command job's exit code. Every wait is on a state, with a bound."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import skyward as sky
from skyward.runtime.spawned import RESULT_LIMIT
from tests.conftest import pid_alive
from tests.hosts.conftest_fixture import ssh_provider
from tests.leftovers import cluster_home
from tests.test_cluster_cli import ROOT, sky as cli, task
from tests.test_cluster_jobs import until

CLIENT = """\
import sys
import skyward as sky

@sky.compute
def slow(go: str, x: int) -> dict:
    import os, time
    while not os.path.exists(go):
        time.sleep(0.05)
    return {"answer": x * 2}

with sky.ComputePool(name="dev", nodes=2, console=False) as pool:
    job = pool.spawn(slow(sys.argv[1], 21))
    print(job.id, flush=True)
    sys.stdin.read()  # held here until killed
"""


@sky.compute
def fails(text: str) -> None:
    raise KeyError(text)


@sky.compute
def where() -> int:
    return sky.instance_info().node


@sky.compute
def too_big() -> bytes:
    return b"x" * (RESULT_LIMIT + 1)


@sky.compute
def held(pids: str) -> None:
    import subprocess as sp
    import time as t

    child = sp.Popen(["sleep", "300"], start_new_session=True)
    with open(pids, "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    t.sleep(300)


@pytest.fixture
def home(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    with cluster_home(monkeypatch, "skyd") as path:
        yield path


def test_a_spawned_call_outlives_its_killed_client_and_a_later_process_collects_it(home: str,
                                                                                  tmp_path: Path) -> None:
    go = tmp_path / "go"
    client = subprocess.Popen([sys.executable, "-c", CLIENT, str(go)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, text=True)
    try:
        job_id = int(client.stdout.readline())  # type: ignore[union-attr]
        client.send_signal(signal.SIGKILL)
        assert client.wait(30) == -signal.SIGKILL
    finally:
        client.kill()
    with sky.ComputePool(name="dev", console=False) as pool:
        job = pool.job(job_id)
        assert (job.id, job.name, job.status) == (job_id, "slow", "RUNNING"), "the job died with its client"
        listed = json.loads(cli("queue", "dev", "--json", cwd=tmp_path).stdout)["dev"]
        assert [(j["id"], j["name"], j["status"]) for j in listed] == [(job_id, "slow", "RUNNING")]
        go.touch()
        assert job.result(timeout=60) == {"answer": 42}
        assert pool.jobs() == [job] and job.status == "SUCCEEDED"
    assert sky.Job("dev", job_id).result() == {"answer": 42}  # (again, detached: the result is kept)


def test_an_exception_comes_back_with_its_type_and_remote_traceback(home: str) -> None:
    with sky.ComputePool(name="dev", nodes=1, console=False) as pool:
        failing, big = pool.spawn(fails("no such key")), pool.spawn(too_big())
        with pytest.raises(KeyError, match="no such key") as raised:
            failing.result(timeout=60)
        assert raised.value.remote_traceback.rstrip().endswith("KeyError: 'no such key'")  # type: ignore[attr-defined]
        assert 'raise KeyError(text)' in raised.value.remote_traceback  # type: ignore[attr-defined]
        assert any(n.startswith("remote traceback (node 0)") for n in raised.value.__notes__)
        assert failing.status == "FAILED" and "KeyError: 'no such key'" in failing.logs()
        with pytest.raises(sky.JobError, match=r"more than the 64 MiB a job's result may keep"):
            big.result(timeout=60)
        assert big.status == "FAILED"


def test_broadcast_gives_one_result_per_node_after_the_block_has_ended(home: str) -> None:
    with sky.ComputePool(name="dev", nodes=3, console=False) as pool:
        every, head = pool.spawn(where(), broadcast=True), pool.spawn(where())
    assert every.result(timeout=60) == [0, 1, 2]
    assert head.result(timeout=60) == 0


def test_the_blocks_end_leaves_a_job_running_and_cancel_ends_its_processes(home: str, tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    with sky.ComputePool(name="dev", nodes=1, console=False) as pool:
        job = pool.spawn(held(str(pids)))
        until(pids.exists, 60, "the spawned call to start")
    started = [int(p) for p in pids.read_text().split()]
    assert job.status == "RUNNING" and all(pid_alive(p) for p in started), "the block's end stopped the job"
    with pytest.raises(sky.JobTimeout, match="not finished within 0.2s"):
        job.result(timeout=0.2)
    job.cancel()
    assert [p for p in started if pid_alive(p)] == [], "cancel returned with the job's processes alive"
    assert job.status == "CANCELLED"
    with pytest.raises(sky.JobError, match="was cancelled"):
        job.result()
    with pytest.raises(sky.JobError, match=r"has already finished \(CANCELLED\)"):
        job.cancel()


def test_bad_requests_raise_typed_errors_naming_what_exists(home: str) -> None:
    with sky.ComputePool(name="dev", nodes=1, console=False) as pool:
        with pytest.raises(sky.JobError, match=r"job 7 of cluster 'dev': no such job \(its queue is empty\)"):
            pool.job(7)
        assert pool.spawn(where()).result(timeout=60) == 0
        with pytest.raises(sky.JobError, match=r"job 7 of cluster 'dev': no such job \(its jobs are 1\)"):
            pool.job(7)
        with pytest.raises(sky.JobError, match="is a job of cluster 'other', not of 'dev'"):
            pool.job(sky.Job("other", 1))
        with pytest.raises(sky.ConfigError, match="broadcast"):
            pool.spawn(where(), broadcast="yes")  # type: ignore[call-overload]
    with pytest.raises(sky.ConfigError, match=r"a pool on a named cluster for pool.spawn\(\)"):
        sky.ComputePool(nodes=1, console=False).spawn(where())


def test_a_command_job_fetched_from_python_gives_its_exit_code_and_log(home: str, tmp_path: Path) -> None:
    task(tmp_path, "num_nodes: 2\nrun: echo \"hello from $SKYPILOT_NODE_RANK\"\n")
    task(tmp_path, "num_nodes: 2\nrun: |\n  echo \"about to fail\"\n  exit 7\n", "fail.yaml")
    assert cli("launch", "-c", "dev", "task.yaml", cwd=tmp_path).returncode == 0
    assert cli("exec", "dev", "fail.yaml", cwd=tmp_path).returncode == 100  # (SkyPilot's code for a failed job)
    with sky.ComputePool(name="dev", console=False) as pool:
        ok, failed = pool.jobs()
        assert (ok.id, ok.name, ok.result(timeout=60)) == (1, "task", 0)
        assert sorted(ok.logs().splitlines()) == ["[node 0] hello from 0", "[node 1] hello from 1"]
        with pytest.raises(sky.JobFailed, match=r"FAILED on node 0 \(exit code 7\)") as raised:
            failed.result(timeout=60)
        assert raised.value.exit_code == 7 and raised.value.log_tail == ["about to fail"]


def test_the_example_submits_in_one_process_and_collects_in_another(home: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SKYWARD_CONSOLE": "plain"}

    def run(*args: str) -> str:
        done = subprocess.run([sys.executable, "examples/detached_job.py", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
        return done.stdout

    assert run("submit") == "submitted job 1 to cluster 'pi'\n"
    assert run("collect", "1") == "job 1 SUCCEEDED: pi is about 3.14 (2 nodes)\n"
    assert cli("status", cwd=Path(home)).stdout.strip() == "no clusters"  # (the collector ended it)


def test_spawn_and_collect_on_ssh_hosts(home: str, test_hosts, wheelhouse) -> None:  # noqa: ANN001
    """The same path on a cluster of two SSH test hosts: the call runs with each host's own
    Python and environment, and its result and exception come back over SSH."""
    provider = ssh_provider(test_hosts[:2], wheelhouse)
    with sky.ComputePool(name="hosts", provider=provider, nodes=2, console=False) as pool:
        every, failing = pool.spawn(where(), broadcast=True), pool.spawn(fails("over ssh"))
    assert every.result(timeout=60) == [0, 1]
    with pytest.raises(KeyError, match="over ssh"):
        failing.result(timeout=60)
    assert (sky.Job("hosts", 1).status, sky.Job("hosts", 2).status) == ("SUCCEEDED", "FAILED")
