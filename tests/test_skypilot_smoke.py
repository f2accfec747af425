"""SkyPilot's own smoke tests for clusters and jobs (tests/smoke_tests/test_basic.py and
test_cluster_job.py in SkyPilot), ported: each test is one SkyPilot case's command sequence with
``skyward`` for ``sky``, on a Local cluster (the ones taking ``where``: on two SSH test hosts too),
with SkyPilot's assertions (exit codes, ``logs
--status`` codes and lines, queue states, output lines), so a change cannot quietly break the
habit of a SkyPilot user. The task files are our own small equivalents of SkyPilot's. Every wait
is on a state, with a bound; docs/cli.md lists the cases that behave differently, and why."""

from __future__ import annotations

import json
import os
import re
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from skyward.launch import execute, plan
from tests.conftest import pid_alive
from tests.hosts.conftest_fixture import kept_bashrcs, ssh_provider
from tests.test_cluster_cli import home, lines, sky, sky_home, task  # noqa: F401  (home: a fixture)
from tests.test_cluster_jobs import job_id, until


@dataclass
class Where:
    """Where a test's cluster runs. Local: it comes up with the test's first ``skyward launch -c``.
    SSH, two test hosts: they need a key, a known_hosts file and a wheelhouse that the command line
    has no flags for, so :meth:`up` brings the cluster up first, in-process and running nothing (as
    ``skyward launch -c NAME`` with no task does); the test's own ``launch -c`` then reuses it."""

    provider: str
    hosts: list = field(default_factory=list)
    wheelhouse: str = ""

    def up(self, cluster: str) -> None:
        if self.provider == "ssh":
            ssh = ssh_provider(self.hosts[:2], self.wheelhouse)
            assert execute(plan(None, num_nodes=2), provider=ssh, console=False, cluster={"name": cluster}) == 0

    def hostnames(self) -> list[str]:
        """Each node's hostname, by rank."""
        return [h.name for h in self.hosts[:2]] if self.provider == "ssh" else [socket.gethostname()] * 2


@pytest.fixture(params=["local", "ssh"])
def where(request: pytest.FixtureRequest) -> Where:
    if request.param == "local":
        return Where("local")
    return Where("ssh", request.getfixturevalue("test_hosts"), request.getfixturevalue("wheelhouse"))

MINIMAL = """\
name: minimal
setup: echo "running setup"
run: echo "hello from the run"
"""

#: Every node checks SkyPilot's variables, in setup and in run (SkyPilot's env_check example),
#: and setup leaves a line in ~/.bashrc, as a ``conda init`` or a PATH edit would.
ENV_CHECK = """\
num_nodes: 2
envs:
  TEST_ENV: from-the-file
setup: |
  [[ -n "$SKYPILOT_SETUP_NODE_RANK" && -n "$SKYPILOT_SETUP_NODE_IPS" && "$TEST_ENV" == from-the-file ]] || exit 11
  echo 'export FROM_SETUP=bashrc' >> ~/.bashrc
run: |
  [[ -n "$SKYPILOT_NODE_IPS" && -n "$SKYPILOT_NODE_RANK" && "$SKYPILOT_NUM_NODES" == 2 ]] || exit 12
  [[ -n "$SKYPILOT_TASK_ID" && -n "$SKYPILOT_CLUSTER_INFO" ]] || exit 13
  [[ "$(echo "$SKYPILOT_NODE_IPS" | wc -l)" == 2 ]] || exit 14
  echo "$SKYPILOT_CLUSTER_INFO" | python3 -c "import json, sys; i = json.load(sys.stdin)
  assert (i['cluster_name'], i['num_nodes']) == ('envs', 2), i" || exit 15
  echo "env ok on $SKYPILOT_NODE_RANK, FROM_SETUP=${FROM_SETUP:-unset}"
"""

ENV_TEST = ('[[ -n "$@VAR@" && -n "$SKYPILOT_NODE_IPS" && -n "$SKYPILOT_NODE_RANK" '
            '&& -n "$SKYPILOT_NUM_NODES" ]] || exit 1')


def state(tmp_path: Path, cluster: str, job: int | None = None) -> tuple[int, str]:
    """``skyward logs CLUSTER [JOB] --status``: its exit code and its line."""
    shown = sky("logs", cluster, *([str(job)] if job else []), "--status", cwd=tmp_path)
    return shown.returncode, shown.stdout.strip()


def queue_states(tmp_path: Path, cluster: str) -> dict[str, str]:
    """Job name -> state, from ``skyward queue CLUSTER --json``."""
    listed = sky("queue", cluster, "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    return {j["name"]: j["status"] for j in json.loads(listed.stdout)[cluster]}


def cluster_status(tmp_path: Path, cluster: str) -> str | None:
    shown = sky("status", "-r", "-o", "json", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    return next((c["status"] for c in json.loads(shown.stdout) if c["name"] == cluster), None)


def test_minimal(home: str, tmp_path: Path, where: Where) -> None:
    """SkyPilot's test_minimal: launch twice, ``logs --status`` of each job, ``logs --sync-down``,
    SKYPILOT_CLUSTER_INFO, exec of a command of several words, exec without a command refused,
    ``status``, cost-report."""
    where.up("mini")
    task(tmp_path, MINIMAL, "minimal.yaml")
    first = sky("launch", "-y", "-c", "mini", "minimal.yaml", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert lines(first.stdout, "hello from the run") == ["[node 0] hello from the run"]
    # The plan names the cluster's own provider and machines (the task runs on its first node).
    assert re.findall(r"^task 'minimal': 1 node\(s\) on (\w+)$", first.stdout, re.M) == [where.provider]
    if where.provider == "ssh":
        assert re.findall(r"^  machines: (\S+)$", first.stdout, re.M) == [f"root@{where.hosts[0].ip}"], first.stdout
    assert state(tmp_path, "mini", 1) == (0, "Job 1: SUCCEEDED")
    assert state(tmp_path, "mini") == (0, "Job 1: SUCCEEDED")  # (the latest job)
    again = sky("launch", "-y", "-c", "mini", "minimal.yaml", cwd=tmp_path)
    assert again.returncode == 0 and job_id(again.stdout) == 2, again.stderr
    assert state(tmp_path, "mini") == (0, "Job 2: SUCCEEDED")
    info = sky("exec", "mini", 'echo "$SKYPILOT_CLUSTER_INFO" | python3 -c '
               '"import json,sys; print(json.load(sys.stdin)[\'cluster_name\'])"', cwd=tmp_path)
    assert info.returncode == 0 and lines(info.stdout, "mini") == ["[node 0] mini"], info.stderr
    assert state(tmp_path, "mini", 3)[0] == 0
    words = sky("exec", "mini", "echo", "hi", "test", cwd=tmp_path)
    assert words.returncode == 0 and job_id(words.stdout) == 4
    assert "hi test" in sky("logs", "mini", "4", "--no-follow", cwd=tmp_path).stdout
    assert sky("exec", "mini", cwd=tmp_path).returncode != 0  # nothing to run: refused
    synced = sky_home("logs", "mini", "1", "--sync-down", cwd=tmp_path, home=tmp_path)
    assert synced.returncode == 0, synced.stderr
    where = re.findall(r"^Job 1 logs: (\S+)$", synced.stdout, re.M)
    assert where == ["~/skyward_logs/mini/1"], synced.stdout
    assert lines((tmp_path / "skyward_logs/mini/1/run.log").read_text(), "hello") == ["[node 0] hello from the run"]
    assert cluster_status(tmp_path, "mini") == "UP"
    report = sky("cost-report", cwd=tmp_path)
    assert report.returncode == 0 and "mini" in report.stdout and "total" in report.stdout


def test_launch_fast(home: str, tmp_path: Path, where: Where) -> None:
    """SkyPilot's test_launch_fast: a second ``launch --fast`` reuses the cluster without running
    setup again, the job succeeds, and the cluster is UP."""
    task(tmp_path, MINIMAL, "minimal.yaml")
    where.up("fast")
    first = sky("launch", "-y", "-c", "fast", "--fast", "minimal.yaml", cwd=tmp_path)
    nodes = 2 if where.provider == "ssh" else 1  # (setup runs on every node of the cluster)
    assert first.returncode == 0, first.stderr
    assert lines(first.stdout, "running setup") == [f"[node {n}] running setup" for n in range(nodes)]
    assert state(tmp_path, "fast", 1)[0] == 0
    second = sky("launch", "-y", "-c", "fast", "--fast", "minimal.yaml", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert lines(second.stdout, "running setup") == [], "setup ran again under --fast"
    assert lines(second.stdout, "hello from the run") == ["[node 0] hello from the run"]
    assert state(tmp_path, "fast", 2) == (0, "Job 2: SUCCEEDED")
    assert cluster_status(tmp_path, "fast") == "UP"


def test_stale_job(home: str, tmp_path: Path) -> None:
    """SkyPilot's test_stale_job: a job still running when the cluster is stopped is FAILED_DRIVER
    after ``start`` (``logs --status``: 100), and job 1 kept SUCCEEDED."""
    assert sky("launch", "-y", "-c", "stale", "echo hi", cwd=tmp_path).returncode == 0
    running = sky("exec", "stale", "-d", "echo start; sleep 10000", cwd=tmp_path)
    assert running.returncode == 0 and job_id(running.stdout) == 2
    until(lambda: state(tmp_path, "stale", 2)[0] == 101, 60, "job 2 to run")
    assert sky("stop", "-y", "stale", cwd=tmp_path).returncode == 0
    assert cluster_status(tmp_path, "stale") == "STOPPED"
    assert sky("start", "-y", "stale", cwd=tmp_path).returncode == 0
    assert state(tmp_path, "stale", 1) == (0, "Job 1: SUCCEEDED")
    assert state(tmp_path, "stale", 2) == (100, "Job 2: FAILED_DRIVER")


def test_env_check(home: str, tmp_path: Path, where: Where) -> None:
    """SkyPilot's test_env_check (its first part): SkyPilot's variables are set in setup and run
    on every node of a two-node cluster, and the job succeeds. The run reads the ~/.bashrc that
    setup wrote on SSH hosts, as SkyPilot's does; not on Local, whose node is this machine, set up
    already (docs/task-files.md; here HOME is a folder of the test's own)."""
    task(tmp_path, ENV_CHECK, "env_check.yaml")
    where.up("envs")
    user_home = tmp_path / "home"
    user_home.mkdir()
    with kept_bashrcs(where.hosts[:2]):
        ran = sky_home("launch", "-y", "-c", "envs", "env_check.yaml", cwd=tmp_path, home=user_home)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    read = "bashrc" if where.provider == "ssh" else "unset"
    assert lines(ran.stdout, "env ok") == [f"[node 0] env ok on 0, FROM_SETUP={read}",
                                           f"[node 1] env ok on 1, FROM_SETUP={read}"]
    assert state(tmp_path, "envs", 1) == (0, "Job 1: SUCCEEDED")
    # Its second part: a task with a setup and no run is a job of its own, and succeeds.
    task(tmp_path, 'setup: echo "hello world"\n', "only_setup.yaml")
    only = sky("launch", "-y", "-c", "envs", "only_setup.yaml", cwd=tmp_path)
    assert only.returncode == 0, only.stderr
    assert state(tmp_path, "envs", 2) == (0, "Job 2: SUCCEEDED")
    assert "hello world" in sky("logs", "envs", "2", cwd=tmp_path).stdout


def test_cli_logs(home: str, tmp_path: Path, where: Where) -> None:
    """SkyPilot's test_cli_logs: four jobs on a two-node cluster; ``logs ID --status``, ``logs 1``
    shows job 1's output and ``logs`` alone the latest job's."""
    where.up("logs")
    stamp = str(time.time())
    assert sky("launch", "-y", "-c", "logs", "--num-nodes", "2", f"echo {stamp} 1", cwd=tmp_path).returncode == 0
    for n in (2, 3, 4):
        assert sky("exec", "logs", f"echo {stamp} {n}", cwd=tmp_path).returncode == 0
    assert state(tmp_path, "logs", 2)[0] == 0
    assert f"{stamp} 1" in sky("logs", "logs", "1", cwd=tmp_path).stdout
    latest = sky("logs", "logs", cwd=tmp_path)
    assert latest.returncode == 0 and f"{stamp} 4" in latest.stdout and f"{stamp} 3" not in latest.stdout


def test_cli_exit_codes(home: str, tmp_path: Path, where: Where) -> None:
    """SkyPilot's test_cli_exit_codes: a successful job exits 0 and ``logs`` of it too; a failed
    job is FAILED, and ``exec`` of it and ``logs`` of it exit 100."""
    where.up("codes")
    ok = sky("launch", "-y", "-c", "codes", "echo success", cwd=tmp_path)
    assert ok.returncode == 0 and lines(ok.stdout, "success") == ["[node 0] success"]
    assert "SUCCEEDED" in state(tmp_path, "codes", 1)[1]
    assert sky("logs", "codes", "1", cwd=tmp_path).returncode == 0
    failed = sky("exec", "codes", "exit 1", cwd=tmp_path)
    assert failed.returncode == 100
    assert state(tmp_path, "codes", 2) == (100, "Job 2: FAILED")
    assert sky("logs", "codes", "2", cwd=tmp_path).returncode == 100


HOSTNAME = """\
num_nodes: 2
run: |
  echo "My hostname: $(hostname) rank $SKYPILOT_NODE_RANK"
  @FAIL@
"""


def test_multi_hostname(home: str, tmp_path: Path, where: Where) -> None:
    """SkyPilot's test_multi_hostname: a two-node task prints a hostname line per node (its own
    hostname and rank); exec of the same task succeeds."""
    task(tmp_path, HOSTNAME, "multi_hostname.yaml", **{"@FAIL@": ""})
    where.up("hosts")
    assert sky("launch", "-y", "-c", "hosts", "multi_hostname.yaml", cwd=tmp_path).returncode == 0
    assert state(tmp_path, "hosts", 1)[0] == 0
    logged = sky("logs", "hosts", "1", cwd=tmp_path).stdout
    assert lines(logged, "My hostname:") == [f"[node {rank}] My hostname: {name} rank {rank}"
                                             for rank, name in enumerate(where.hostnames())]
    assert sky("exec", "hosts", "multi_hostname.yaml", cwd=tmp_path).returncode == 0
    assert state(tmp_path, "hosts", 2)[0] == 0


FAILED_WORKER_SETUP = """\
num_nodes: 2
setup: |
  if [ "$SKYPILOT_SETUP_NODE_RANK" = 1 ]; then exit 7; fi
run: |
  echo "run on $SKYPILOT_NODE_RANK"
"""


def test_multi_node_failure(home: str, tmp_path: Path, where: Where) -> None:
    """SkyPilot's test_multi_node_failure: a setup that fails on the worker only fails the launch
    (100, FAILED_SETUP, the node named); then a run that fails on the worker only fails the job
    (``logs --status``: FAILED, 100), and both nodes' output is in its log."""
    task(tmp_path, FAILED_WORKER_SETUP, "failed_worker_setup.yaml")
    where.up("fail")
    setup = sky("launch", "-y", "-c", "fail", "failed_worker_setup.yaml", cwd=tmp_path)
    assert setup.returncode == 100, (setup.stdout, setup.stderr)
    assert "FAILED_SETUP (node 1: exit code 7)" in setup.stderr
    assert [line for line in lines(setup.stdout, "run on") if line.startswith("[node 1]")] == []
    assert state(tmp_path, "fail", 1) == (100, "Job 1: FAILED_SETUP")
    task(tmp_path, HOSTNAME, "failed_worker_run.yaml", **{"@FAIL@": '[ "$SKYPILOT_NODE_RANK" = 1 ] && exit 5; true'})
    failed = sky("exec", "fail", "failed_worker_run.yaml", cwd=tmp_path)
    assert failed.returncode == 100, failed.stderr
    assert "FAILED (node 1: exit code 5)" in failed.stderr
    assert state(tmp_path, "fail", 2) == (100, "Job 2: FAILED")
    logged = sky("logs", "fail", "2", cwd=tmp_path).stdout
    assert len([line for line in logged.splitlines() if "My hostname:" in line]) == 2


JOB = """\
name: job
resources:
  cpus: @CPUS@
run: |
  echo "job $SKYPILOT_TASK_ID started"
  sleep 10000
"""


def test_job_queue(home: str, tmp_path: Path, where: Where) -> None:
    """SkyPilot's test_job_queue, on CPUs instead of half a GPU each: three detached jobs named by
    ``exec -n`` that each take half the head node of a two-node cluster (they have no num_nodes);
    two run, the third is PENDING, the queue's RESOURCES are the jobs' own (one node each);
    cancelling job 2 lets job 3 run."""
    half = len(os.sched_getaffinity(0)) / 2  # (the SSH test hosts have this machine's CPUs)
    where.up("jq")
    assert sky("launch", "-y", "-c", "jq", "--num-nodes", "2", "echo up", cwd=tmp_path).returncode == 0
    task(tmp_path, JOB, "job.yaml", **{"@CPUS@": str(half)})
    for n in (1, 2, 3):
        assert sky("exec", "jq", "-n", f"jq-{n}", "-d", "job.yaml", cwd=tmp_path).returncode == 0
    want = {"command": "SUCCEEDED", "jq-1": "RUNNING", "jq-2": "RUNNING", "jq-3": "PENDING"}
    until(lambda: queue_states(tmp_path, "jq") == want, 60, "jq-1 and jq-2 RUNNING, jq-3 PENDING")
    shown = sky("queue", "jq", cwd=tmp_path).stdout.splitlines()
    assert shown[1].split() == ["ID", "NAME", "SUBMITTED", "STARTED", "DURATION", "RESOURCES", "STATUS"]
    assert [row.split()[-2:] for row in shown[2:]] == [["1x[CPU:1]", "PENDING"], ["1x[CPU:1]", "RUNNING"],
                                                       ["1x[CPU:1]", "RUNNING"], ["2x[CPU:0.5]", "SUCCEEDED"]]
    assert sky("cancel", "-y", "jq", "3", cwd=tmp_path).returncode == 0  # job 3 is jq-2
    until(lambda: queue_states(tmp_path, "jq")["jq-3"] == "RUNNING", 60, "jq-3 to run")
    assert queue_states(tmp_path, "jq")["jq-2"] == "CANCELLED"
    assert sky("cancel", "-y", "jq", "4", cwd=tmp_path).returncode == 0
    assert state(tmp_path, "jq", 4)[0] == 103


def test_cancel(home: str, tmp_path: Path, where: Where) -> None:
    """SkyPilot's test_cancel_ibm (the generic part of its cancel tests): a looping detached job is
    RUNNING, ``cancel -y`` ends it (its process is gone from the node; the SSH test hosts share
    this machine's process ids), and the queue shows it CANCELLED; a later job still runs."""
    task(tmp_path, MINIMAL, "minimal.yaml")
    where.up("cx")
    assert sky("launch", "-y", "-c", "cx", "minimal.yaml", cwd=tmp_path).returncode == 0
    loop = sky("exec", "cx", "-d", "while true; do echo \"Hello SkyPilot from $$\"; sleep 0.5; done", cwd=tmp_path)
    assert loop.returncode == 0 and job_id(loop.stdout) == 2
    printed = until(lambda: re.findall(r"Hello SkyPilot from (\d+)",
                                       sky("logs", "cx", "2", "--no-follow", cwd=tmp_path).stdout), 60, "job 2 to print")
    looping = int(printed[0])
    assert state(tmp_path, "cx", 2)[0] == 101 and pid_alive(looping)
    assert sky("cancel", "-y", "cx", "2", cwd=tmp_path).returncode == 0
    assert not pid_alive(looping), "the cancelled job's process is still running"
    assert state(tmp_path, "cx", 2) == (103, "Job 2: CANCELLED")
    assert sky("exec", "cx", "echo after", cwd=tmp_path).returncode == 0
    assert state(tmp_path, "cx", 3)[0] == 0


def test_inline_env_and_env_file(home: str, tmp_path: Path, where: Where) -> None:
    """SkyPilot's test_inline_env and test_inline_env_file: ``launch --env`` and ``exec --env`` /
    ``exec --env-file`` reach a command, alongside SkyPilot's node variables."""
    where.up("ie")
    ran = sky("launch", "-y", "-c", "ie", "--env", "TEST_ENV=hello world", "--",
              ENV_TEST.replace("@VAR@", "TEST_ENV"), cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert state(tmp_path, "ie", 1)[0] == 0
    check = ENV_TEST.replace("@VAR@", "TEST_ENV2")
    assert sky("exec", "ie", "--env", "TEST_ENV2=success", check, cwd=tmp_path).returncode == 0
    assert state(tmp_path, "ie", 2)[0] == 0
    (tmp_path / "sample_dotenv").write_text("TEST_ENV2=success\n")
    assert sky("exec", "ie", "--env-file", "sample_dotenv", check, cwd=tmp_path).returncode == 0
    assert state(tmp_path, "ie", 3)[0] == 0
    assert sky("exec", "ie", check, cwd=tmp_path).returncode == 100  # the check can fail (a failed job: 100)
    assert state(tmp_path, "ie", 4)[0] == 100


def test_autostop_then_start(home: str, tmp_path: Path) -> None:
    """SkyPilot's test_autostop and test_stop_gcp_spot (on minutes scaled down): ``autostop -i``
    shows in ``status``, the idle cluster is STOPPED, ``start -y`` brings it back with its files,
    and exec runs again."""
    assert sky("launch", "-y", "-d", "-c", "as", "--num-nodes", "2", "--", "touch myfile", cwd=tmp_path).returncode == 0
    assert sky("autostop", "-y", "as", "-i", "1", cwd=tmp_path).returncode == 0
    row = [r for r in sky("status", cwd=tmp_path).stdout.splitlines() if r.startswith("as ")]
    assert len(row) == 1 and " 1m " in row[0] and "UP" in row[0]
    until(lambda: state(tmp_path, "as", 1)[0] == 0, 60, "job 1 to succeed")
    assert sky("autostop", "-y", "as", "-i", "0.05", cwd=tmp_path).returncode == 0  # 3 s
    until(lambda: cluster_status(tmp_path, "as") == "STOPPED", 60, "the cluster to autostop")
    assert sky("start", "-y", "as", cwd=tmp_path).returncode == 0
    assert cluster_status(tmp_path, "as") == "UP"
    assert sky("exec", "as", "--", "ls myfile", cwd=tmp_path).returncode == 0
    assert state(tmp_path, "as", 2)[0] == 0


def test_autodown(home: str, tmp_path: Path) -> None:
    """SkyPilot's test_autodown (on minutes scaled down): ``autostop --down -i 1`` shows "1m (down)",
    the cluster stays UP, then goes away once idle; ``launch --down -d`` is gone after its job."""
    task(tmp_path, MINIMAL, "minimal.yaml")
    assert sky("launch", "-y", "-d", "-c", "ad", "--num-nodes", "2", "minimal.yaml", cwd=tmp_path).returncode == 0
    assert sky("autostop", "-y", "ad", "--down", "-i", "1", cwd=tmp_path).returncode == 0
    row = [r for r in sky("status", cwd=tmp_path).stdout.splitlines() if r.startswith("ad ")]
    assert len(row) == 1 and "1m (down)" in row[0]
    assert cluster_status(tmp_path, "ad") == "UP"
    assert sky("autostop", "-y", "ad", "--down", "-i", "0.05", cwd=tmp_path).returncode == 0
    until(lambda: cluster_status(tmp_path, "ad") is None, 60, "the cluster to go down")
    again = sky("launch", "-y", "-d", "-c", "ad", "--num-nodes", "2", "--down", "minimal.yaml", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    until(lambda: cluster_status(tmp_path, "ad") is None, 60, "the cluster to go down after its job")


def test_launch_fast_with_autostop(home: str, tmp_path: Path) -> None:
    """SkyPilot's test_launch_fast_with_autostop (on minutes scaled down): ``launch --fast -i`` on a
    cluster that has autostopped starts it again and runs the job; the cluster is UP after it."""
    task(tmp_path, MINIMAL, "minimal.yaml")
    first = sky("launch", "-y", "-c", "fa", "--fast", "-i", "0.05", "minimal.yaml", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert state(tmp_path, "fa", 1)[0] == 0
    until(lambda: cluster_status(tmp_path, "fa") == "STOPPED", 60, "the cluster to autostop")
    again = sky("launch", "-y", "-c", "fa", "--fast", "-i", "1", "minimal.yaml", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert lines(again.stdout, "hello from the run") == ["[node 0] hello from the run"]
    assert state(tmp_path, "fa", 2) == (0, "Job 2: SUCCEEDED")
    assert cluster_status(tmp_path, "fa") == "UP"


FAILING_SETUP = """\
num_nodes: 3
setup: |
  echo "Running setup."
  if [ "$SKYPILOT_SETUP_NODE_RANK" -eq 1 ]; then echo "I'm a good worker, passing..."; else exit 1; fi
run: |
  echo "Finished"
"""


def test_launch_with_failing_setup(home: str, tmp_path: Path) -> None:
    """SkyPilot's test_launch_with_failing_setup: a three-node setup that fails on nodes 0 and 2
    fails the launch, and the error names a failed node (SkyPilot's names every failed worker;
    ours the first that ended so), never the good one."""
    task(tmp_path, FAILING_SETUP, "failing_setup.yaml")
    ran = sky("launch", "-y", "-c", "fs", "failing_setup.yaml", cwd=tmp_path)
    assert ran.returncode == 100, (ran.stdout, ran.stderr)
    named = re.findall(r"FAILED_SETUP \(node (\d+): exit code 1\)", ran.stderr)
    assert len(named) == 1 and named[0] in ("0", "2"), ran.stderr
    assert state(tmp_path, "fs", 1) == (100, "Job 1: FAILED_SETUP")


def test_long_setup_run_script(home: str, tmp_path: Path, where: Where) -> None:
    """SkyPilot's test_long_setup_run_script, scaled down from 204,800 lines to 20,480 that print
    nothing (SkyPilot's echo each number): setup and run blocks of about 200 KB each (over the
    128 KiB one command-line argument may hold) run through launch and exec, to their last line."""
    count = 1024 * 20
    body = "".join(f"  : {i}\n" for i in range(count))
    (tmp_path / "long.yaml").write_text(f'setup: |\n  echo "start long setup"\n{body}  echo "end long setup"\n'
                                        f'run: |\n  echo "run"\n{body}  echo "end run"\n')
    where.up("long")
    ran = sky("launch", "-y", "-c", "long", "long.yaml", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-2000:]
    nodes = 2 if where.provider == "ssh" else 1  # (setup runs on every node of the cluster)
    assert lines(ran.stdout, "end long setup") == [f"[node {n}] end long setup" for n in range(nodes)]
    assert lines(ran.stdout, "end run") == ["[node 0] end run"]
    assert sky("exec", "long", "echo hello", cwd=tmp_path).returncode == 0  # (exec exits with its job's code)
    again = sky("exec", "long", "long.yaml", cwd=tmp_path)
    assert again.returncode == 0 and lines(again.stdout, "end run") == ["[node 0] end run"], again.stderr[-2000:]
    assert state(tmp_path, "long", 3) == (0, "Job 3: SUCCEEDED")
