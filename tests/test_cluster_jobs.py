"""A cluster's job queue through the real command line (Local clusters): ids, ``skyward queue``,
``cancel``, ``logs --status``, ``-d``, a killed follower, scheduling by the node's room, and
autostop waiting for the queue. Every wait is on a state, with a bound."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from skyward.clusters import jobs, manage
from skyward.runtime.jobqueue import TOOL
from skyward.launch import execute, plan
from tests.conftest import pid_alive, wait_gone
from tests.hosts.conftest_fixture import ssh_provider
from tests.test_cluster_cli import ROOT, home, lines, sky, task  # noqa: F401  (home: the fixture)

QUICK = """\
num_nodes: 2
run: |
  echo "job $SKYWARD_JOB_ID on $SKYPILOT_NODE_RANK"
"""

HELD = """\
num_nodes: @NODES@
resources:
  cpus: @CPUS@
run: |
  echo $$ > "$PIDS/@NAME@-$SKYPILOT_NODE_RANK.sh"
  setsid sleep 300 < /dev/null > /dev/null 2>&1 &
  echo $! > "$PIDS/@NAME@-$SKYPILOT_NODE_RANK.bg"
  echo "started on $SKYPILOT_NODE_RANK"
  while [ ! -e "$GO/@NAME@" ]; do sleep 0.1; done
  kill $!
  echo "released on $SKYPILOT_NODE_RANK"
"""


def held(tmp_path: Path, name: str, nodes: int = 2, cpus: str = "1") -> Path:
    """A task file whose job writes its pids and waits for ``GO/<name>`` (``--env`` them)."""
    return task(tmp_path, HELD, f"{name}.yaml", **{"@NAME@": name, "@NODES@": str(nodes), "@CPUS@": cpus})


def until(check: Callable[[], object], timeout: float, what: str) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def job_id(out: str) -> int:
    found = re.findall(r"^Job ID: (\d+)$", out, re.M)
    assert len(found) == 1, out
    return int(found[0])


def status(tmp_path: Path, job: int | None = None) -> int:
    return sky("logs", "dev", *([str(job)] if job else []), "--status", cwd=tmp_path).returncode


def queue(tmp_path: Path, *flags: str) -> dict[int, dict]:
    listed = sky("queue", "dev", "--json", *flags, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    return {j["id"]: j for j in json.loads(listed.stdout)["dev"]}


def env(tmp_path: Path) -> list[str]:
    (tmp_path / "pids").mkdir(exist_ok=True)
    (tmp_path / "go").mkdir(exist_ok=True)
    return ["--env", f"PIDS={tmp_path / 'pids'}", "--env", f"GO={tmp_path / 'go'}"]


def pids_of(tmp_path: Path, name: str) -> list[int]:
    return [int(p.read_text()) for p in sorted((tmp_path / "pids").glob(f"{name}-*"))]


def test_jobs_get_ids_in_order_and_the_queue_lists_them(home: str, tmp_path: Path) -> None:
    task(tmp_path, QUICK)
    ids = []
    first = sky("launch", "-c", "dev", "task.yaml", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    ids.append(job_id(first.stdout))
    assert lines(first.stdout, "job 1 on") == ["[node 0] job 1 on 0", "[node 1] job 1 on 1"]
    for _ in range(2):
        again = sky("exec", "dev", "task.yaml", cwd=tmp_path)
        assert again.returncode == 0, again.stderr
        ids.append(job_id(again.stdout))
    assert ids == [1, 2, 3]
    table = sky("queue", "dev", cwd=tmp_path).stdout.splitlines()
    assert table[0] == "Job queue of cluster dev"
    assert table[1].split() == ["ID", "NAME", "SUBMITTED", "STARTED", "DURATION", "RESOURCES", "STATUS"]
    assert [row.split()[0] for row in table[2:]] == ["3", "2", "1"]  # newest first
    assert all(row.split()[-1] == "SUCCEEDED" and "2x[CPU:0.5]" in row for row in table[2:])
    shown = queue(tmp_path)
    assert [(j["id"], j["name"], j["status"], j["exit_code"]) for j in shown.values()] == \
        [(1, "task", "SUCCEEDED", 0), (2, "task", "SUCCEEDED", 0), (3, "task", "SUCCEEDED", 0)]
    assert all(j["submitted"] <= j["started"] <= j["ended"] for j in shown.values())
    missing = sky("queue", "nothing", cwd=tmp_path)
    assert missing.returncode == 1 and "no cluster by this name" in missing.stderr
    # A node asked while its worker names its tool (as a job is queued, when `exec` starts its
    # followers) finds the file empty: no queue there yet (102), not a Python error.
    record = jobs.cluster_record("dev")
    tool = Path(f"{record.roots[1]}/c/{record.id}/{TOOL}")
    named, _ = tool.read_text(), tool.write_text("")
    try:
        assert jobs.run_tool(record, record.instances[1], "rows") == (102, "")
    finally:
        tool.write_text(named)


def test_logs_status_codes_and_cancel_ends_every_process_on_every_node(home: str, tmp_path: Path) -> None:
    task(tmp_path, QUICK)
    assert sky("launch", "-c", "dev", "task.yaml", cwd=tmp_path).returncode == 0
    assert status(tmp_path, 1) == 0
    task(tmp_path, "num_nodes: 2\nrun: exit 7\n", "fail.yaml")
    failed = sky("exec", "dev", "fail.yaml", cwd=tmp_path)
    assert failed.returncode == 100 and "FAILED (node 0: exit code 7)" in failed.stderr  # (SkyPilot's code)
    assert status(tmp_path, 2) == 100 and queue(tmp_path)[2]["exit_code"] == 7
    assert status(tmp_path, 99) == 102

    held(tmp_path, "h")
    detached = sky("exec", "dev", "h.yaml", "-d", *env(tmp_path), cwd=tmp_path)
    assert detached.returncode == 0 and job_id(detached.stdout) == 3
    assert status(tmp_path) == 101  # (the latest job)
    until(lambda: len(pids_of(tmp_path, "h")) == 4, 30, "the job's processes on both nodes")
    pids = pids_of(tmp_path, "h")
    assert all(pid_alive(p) for p in pids)
    finished = sky("cancel", "dev", "1", "-y", cwd=tmp_path)
    assert finished.returncode == 1 and "job 1 is SUCCEEDED" in finished.stderr
    unknown = sky("cancel", "dev", "42", "-y", cwd=tmp_path)
    assert unknown.returncode == 1 and "jobs 1, 2, 3" in unknown.stderr
    cancelled = sky("cancel", "dev", "3", "-y", cwd=tmp_path)
    assert cancelled.returncode == 0, cancelled.stderr
    assert "job 3 on cluster dev CANCELLED" in cancelled.stdout
    assert [p for p in pids if pid_alive(p)] == [], "cancel returned with the job's processes alive"
    assert status(tmp_path, 3) == 103 and queue(tmp_path)[3]["status"] == "CANCELLED"
    assert all(pid_alive(p) for p, _ in manage.ClusterStore().get("dev").workers)  # the cluster stays


def test_detach_returns_at_once_and_a_killed_follower_leaves_the_job_running(home: str, tmp_path: Path) -> None:
    task(tmp_path, QUICK)
    assert sky("launch", "-c", "dev", "task.yaml", cwd=tmp_path).returncode == 0
    held(tmp_path, "d")
    detached = sky("exec", "dev", "d.yaml", "-d", *env(tmp_path), cwd=tmp_path)
    assert detached.returncode == 0 and "skyward logs dev 2" in detached.stderr
    assert status(tmp_path, 2) == 101  # returned while the job runs
    (tmp_path / "go" / "d").touch()
    until(lambda: status(tmp_path, 2) == 0, 30, "job 2 to succeed")

    held(tmp_path, "i")  # Ctrl-C stops following, not the job: even before the cluster is let go
    follower = subprocess.Popen([sys.executable, "-m", "skyward.cli", "exec", "dev", "i.yaml", *env(tmp_path)],
                                cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert follower.stdout is not None and follower.stdout.readline() == "Job ID: 3\n"
        follower.send_signal(signal.SIGSTOP)  # (the Ctrl-C is heard where this stops it: soon after the id)
        follower.send_signal(signal.SIGINT)
        follower.send_signal(signal.SIGCONT)
        assert follower.wait(30) == 130
        assert "stopped following job 3; it goes on" in follower.stderr.read()
    finally:
        follower.kill()
        follower.communicate(timeout=30)  # (its pipes closed, not left to the garbage collector)
    assert status(tmp_path, 3) == 101
    (tmp_path / "go" / "i").touch()
    until(lambda: status(tmp_path, 3) == 0, 30, "job 3 to succeed")

    held(tmp_path, "f")
    follower = subprocess.Popen([sys.executable, "-m", "skyward.cli", "exec", "dev", "f.yaml", *env(tmp_path)],
                                cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        until(lambda: len(pids_of(tmp_path, "f")) == 4, 60, "job 4 to run")
        until(lambda: manage.status(["dev"])[0].holder is None, 30, "the follower to let the cluster go")
        follower.send_signal(signal.SIGKILL)
        follower.wait(10)
    finally:
        follower.kill()
    assert status(tmp_path, 4) == 101
    assert all(pid_alive(p) for p in pids_of(tmp_path, "f")), "the job died with its follower"
    (tmp_path / "go" / "f").touch()
    until(lambda: status(tmp_path, 4) == 0, 30, "job 4 to succeed without its client")
    followed = sky("logs", "dev", cwd=tmp_path)  # (the latest job)
    assert lines(followed.stdout, "released on") == ["[node 0] released on 0", "[node 1] released on 1"]
    assert lines(sky("logs", "dev", "4", "--tail", "1", cwd=tmp_path).stdout, "on") == \
        ["[node 0] released on 0", "[node 1] released on 1"]


SETUP_IN_JOB = """\
num_nodes: 2
setup: |
  echo "setup on $SKYPILOT_SETUP_NODE_RANK"
  while [ ! -e "$GO/setup" ]; do sleep 0.1; done
run: |
  echo "run on $SKYPILOT_NODE_RANK"
  while [ ! -e "$GO/run" ]; do sleep 0.1; done
"""


def test_setup_runs_inside_the_job_setting_up_then_running_and_failed_setup(home: str, tmp_path: Path) -> None:
    """SkyPilot's states of a job with a setup block: SETTING_UP while setup runs (no client
    needed), RUNNING once it is done, FAILED_SETUP with setup's exit code when it fails (the run
    never starts, `launch` and `logs --status` exit 100)."""
    task(tmp_path, SETUP_IN_JOB, "setup.yaml")
    flags = env(tmp_path)
    submitted = sky("launch", "-c", "dev", "-d", "setup.yaml", *flags, cwd=tmp_path)
    assert submitted.returncode == 0 and job_id(submitted.stdout) == 1, submitted.stderr
    until(lambda: "setup on 1" in sky("logs", "dev", "1", "--no-follow", cwd=tmp_path).stdout, 60, "setup to print")
    assert queue(tmp_path)[1]["status"] == "SETTING_UP" and status(tmp_path, 1) == 101
    (tmp_path / "go" / "setup").touch()
    until(lambda: queue(tmp_path)[1]["status"] == "RUNNING", 30, "the run to start after setup")
    (tmp_path / "go" / "run").touch()
    until(lambda: status(tmp_path, 1) == 0, 30, "job 1 to succeed")
    logged = sky("logs", "dev", "1", cwd=tmp_path).stdout
    assert lines(logged, "setup on") == ["[node 0] setup on 0", "[node 1] setup on 1"]
    assert lines(logged, "run on") == ["[node 0] run on 0", "[node 1] run on 1"]

    task(tmp_path, "num_nodes: 2\nsetup: echo bad setup; exit 7\nrun: echo never ran\n", "bad.yaml")
    failed = sky("launch", "-c", "dev", "bad.yaml", cwd=tmp_path)
    assert failed.returncode == 100 and "FAILED_SETUP (node 0: exit code 7)" in failed.stderr, failed.stderr
    assert lines(failed.stdout, "bad setup") == ["[node 0] bad setup", "[node 1] bad setup"]
    assert lines(failed.stdout, "never ran") == []
    shown = sky("logs", "dev", "2", "--status", cwd=tmp_path)
    assert (shown.returncode, shown.stdout.strip()) == (100, "Job 2: FAILED_SETUP")
    assert queue(tmp_path)[2]["exit_code"] == 7


def test_a_job_needing_the_whole_node_waits_pending_behind_running_ones(home: str, tmp_path: Path) -> None:
    cpus = len(os.sched_getaffinity(0))
    task(tmp_path, "run: echo up\n")
    assert sky("launch", "-c", "dev", "task.yaml", cwd=tmp_path).returncode == 0
    small, big = held(tmp_path, "small", nodes=1, cpus="1"), held(tmp_path, "big", nodes=1, cpus=str(cpus))
    small.write_text(small.read_text().replace("resources:\n  cpus: 1\n", ""))  # (0.5 CPU: the default)
    flags = env(tmp_path)
    for name in ("small", "small"):
        assert sky("exec", "dev", f"{name}.yaml", "-d", *flags, cwd=tmp_path).returncode == 0
    assert sky("exec", "dev", "big.yaml", "-d", *flags, cwd=tmp_path).returncode == 0
    until(lambda: [j["status"] for j in queue(tmp_path).values()][1:] == ["RUNNING", "RUNNING", "PENDING"], 30,
          "two small jobs running at once, the big one pending")
    assert queue(tmp_path)[4]["resources"] == f"1x[CPU:{cpus}]"
    (tmp_path / "go" / "small").touch()  # both small jobs end: the big one starts without a client
    until(lambda: queue(tmp_path)[4]["status"] == "RUNNING", 30, "the big job to start")
    (tmp_path / "go" / "big").touch()
    until(lambda: status(tmp_path, 4) == 0, 30, "the big job to succeed")
    task(tmp_path, f"resources:\n  cpus: {cpus * 4}\nrun: echo never\n", "huge.yaml")
    refused = sky("exec", "dev", "huge.yaml", cwd=tmp_path)
    assert refused.returncode == 1 and "resources.cpus" in refused.stderr and f"at most {cpus}" in refused.stderr


def test_autostop_waits_for_running_and_pending_jobs(home: str, tmp_path: Path) -> None:
    cpus = len(os.sched_getaffinity(0))
    task(tmp_path, "run: echo up\n")
    assert sky("launch", "-c", "dev", "-i", "0.05", "task.yaml", cwd=tmp_path).returncode == 0  # 3 s idle
    workers = [pid for pid, _ in manage.ClusterStore().get("dev").workers]
    held(tmp_path, "one", nodes=1, cpus=str(cpus))
    held(tmp_path, "two", nodes=1, cpus=str(cpus))
    flags = env(tmp_path)
    assert sky("exec", "dev", "one.yaml", "-d", *flags, cwd=tmp_path).returncode == 0
    assert sky("exec", "dev", "two.yaml", "-d", *flags, cwd=tmp_path).returncode == 0
    left = time.monotonic()
    while time.monotonic() - left < 8:  # well past the 3 s autostop, polled: one runs, two waits
        assert [j["status"] for j in queue(tmp_path).values()][1:] == ["RUNNING", "PENDING"]
        assert all(pid_alive(p) for p in workers), "autostop ended the cluster under a running job"
    (tmp_path / "go" / "one").touch()
    until(lambda: queue(tmp_path)[3]["status"] == "RUNNING", 30, "the pending job to start")
    assert all(pid_alive(p) for p in workers), "autostop ended the cluster with a job pending"
    (tmp_path / "go" / "two").touch()
    assert wait_gone(workers, 30) == [], "autostop did not end the cluster once its jobs were done"


def test_the_queue_and_cancel_on_ssh_hosts(home: str, tmp_path: Path, test_hosts, wheelhouse,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """A cluster of two SSH test hosts: ids from the head, the queue read over SSH, a cancel that
    ends the job's processes on both hosts (they share this machine's process ids)."""
    shared = Path(tempfile.mkdtemp(prefix="skyjobs", dir="/tmp"))  # (the hosts' users can write here)
    for sub in ("pids", "go"):
        (shared / sub).mkdir()
    os.chmod(shared, 0o777)
    for sub in ("pids", "go"):
        os.chmod(shared / sub, 0o777)
    flags = [f"PIDS={shared / 'pids'}", f"GO={shared / 'go'}"]
    quick = task(tmp_path, QUICK)
    provider = ssh_provider(test_hosts[:2], wheelhouse)
    assert execute(plan(quick), provider=provider, console=False, cluster={"name": "hosts"}) == 0
    assert lines(capsys.readouterr().out, "job 1 on") == ["[node 0] job 1 on 0", "[node 1] job 1 on 1"]
    assert execute(plan(held(tmp_path, "s"), env=flags), console=False, run_setup=False, detach_run=True,
                   cluster={"name": "hosts", "attach_only": True}) == 0
    assert "Job ID: 2" in capsys.readouterr().out
    until(lambda: len([p for p in (shared / "pids").glob("s-*")]) == 4, 60, "job 2 to run on both hosts")
    pids = [int(p.read_text()) for p in (shared / "pids").glob("s-*")]
    assert [(j.id, j.status) for j in jobs.jobs("hosts")] == [(1, "SUCCEEDED"), (2, "RUNNING")]
    cancelled, problems = jobs.cancel("hosts", [2])
    assert (cancelled, problems) == ([2], [])
    assert [p for p in pids if pid_alive(p)] == []
    assert jobs.job("hosts", 2).status == "CANCELLED"
    assert manage.down("hosts") == []


def test_a_followed_job_that_ends_before_the_detach_leaves_it_the_connections(home: str, tmp_path: Path,
                                                                              test_hosts, wheelhouse) -> None:
    """``exec NAME 'echo'`` follows its job while the pool detaches, over the same SSH
    connections; a job that ends first must not close them under the detach (which confirms
    each bridge gone over them: it failed with "the SSH connection ... was closed", exit 1)."""
    from skyward import ComputePool
    from skyward.launch import cluster as clusters

    provider = ssh_provider(test_hosts[:2], wheelhouse)
    assert execute(plan(task(tmp_path, QUICK)), provider=provider, console=False, cluster={"name": "fol"}) == 0
    err = io.StringIO()
    with ComputePool(name="fol") as pool:  # (attaches: the cluster is up)
        shape = plan(task(tmp_path, QUICK))
        job = clusters.submit_job(pool, shape, "true", {}, None)
        following = clusters.start_following("fol", job, False, clusters.kept_connections(pool), err)
        until(lambda: not any(t.name == f"skyward-follow-{job}" for t in threading.enumerate()), 60,
              "the follow to see the job end")
    assert following() == 0, err.getvalue()
    assert jobs.job("fol", job).status == "SUCCEEDED"
    assert manage.down("fol") == []


def test_a_follower_looks_again_within_milliseconds_at_first_then_every_follow_poll() -> None:
    # `skyward exec NAME true` used to wait a whole FOLLOW_POLL (0.2 s) for a job that had ended
    # just after the follower's first look.
    from skyward.runtime import jobtool
    from skyward.runtime.jobqueue import FOLLOW_POLL

    looks = jobtool.pauses()
    schedule = [next(looks) for _ in range(40)]
    assert schedule[0] <= 0.01
    assert sum(schedule[:5]) < FOLLOW_POLL  # five looks where there was one
    assert schedule == sorted(schedule) and schedule[-1] == max(schedule) == FOLLOW_POLL


def test_a_follower_sees_its_command_end_at_once_not_at_the_end_of_its_pause(tmp_path: Path) -> None:
    # The queue removes a running command's pid file as the command ends: a follower waiting out
    # a long pause returns as soon as the file goes (a stat every few milliseconds).
    from skyward.runtime import jobtool

    pid_file = tmp_path / "7.pid"
    pid_file.write_text("1")
    returned = threading.Event()
    waiter = threading.Thread(target=lambda: (jobtool.watch(str(pid_file), 600.0), returned.set()), daemon=True)
    waiter.start()
    assert not returned.wait(0.05)  # (the file is there: it waits)
    pid_file.unlink()
    assert returned.wait(30)  # (a fraction of its 600 s pause)


def test_a_follower_started_as_its_job_is_queued_waits_for_the_job_then_follows_it(tmp_path: Path, capfd) -> None:
    # `exec` starts each node's follower as soon as the head has numbered the job, while the nodes
    # queue it: a follower that looked before its node had queued the job said "no such job" (102).
    from skyward.runtime import jobqueue, jobtool

    base = str(tmp_path)
    conn = jobqueue.connect(base)
    assert jobtool.follow(base, 0, 9, keep_following=True, tail=-1) == 102  # (asked later: at once)
    said: list[int] = []
    follower = threading.Thread(target=lambda: said.append(jobtool.follow(base, 0, 9, keep_following=True, tail=-1,
                                                                          appear=60.0)), daemon=True)
    follower.start()
    log = Path(jobqueue.log_path(base, 0, 9))
    log.parent.mkdir(parents=True)
    log.write_text("queued late\n")
    conn.execute("INSERT INTO jobs (id, name, submitted, cpus, gpus, resources, nodes) VALUES (9, 'late', 0, 0.5, 0, "
                 "'1x[CPU:0.5]', 1)")
    conn.execute("INSERT INTO tasks (job, node, status, exit_code, owner) VALUES (9, 0, 'SUCCEEDED', 0, ?)", (os.getpid(),))
    conn.close()
    follower.join(60)
    assert said == [0]
    out = capfd.readouterr()
    assert out.out == "queued late\n" and f"{jobtool.END_MARK} SUCCEEDED 0" in out.err
