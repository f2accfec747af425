"""More of SkyPilot's cluster and job smoke tests (tests/smoke_tests/test_basic.py and
test_cluster_job.py in SkyPilot), ported as tests/test_skypilot_smoke.py ports the first ones: one
SkyPilot case's command sequence per test, with ``skyward`` for ``sky`` and SkyPilot's assertions,
on a Local cluster (those taking ``where``: on two SSH test hosts too). Every wait is on a state,
with a bound; docs/cli.md lists every case and what became of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import wait_gone
from tests.test_cluster_cli import ROOT, home, lines, sky, task  # noqa: F401  (home: a fixture)
from tests.test_cluster_jobs import until
from tests.test_skypilot_smoke import MINIMAL, Where, cluster_status, queue_states, state, where  # noqa: F401  (where: a fixture)


def git(*args: str, cwd: Path) -> str:
    done = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True)
    return done.stdout.strip()


def test_minimal_with_git_workdir(home: str, tmp_path: Path, where: Where) -> None:
    """SkyPilot's test_minimal_with_git_workdir (a repository of the test's own for SkyPilot's on
    GitHub): ``launch --git-url`` clones the workdir, and later ``launch``/``exec`` with
    ``--git-url`` and ``--git-ref`` move the same cluster's clone to a branch, a tag, a commit and
    back to the default branch; ``git status`` in a plain ``exec`` shows where it is."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git("init", "-q", "-b", "master", cwd=repo)
    (repo / "version.txt").write_text("one\n")
    git("add", "version.txt", cwd=repo)
    git("commit", "-q", "-m", "one", cwd=repo)
    git("tag", "v0.10.0", cwd=repo)
    git("checkout", "-q", "-b", "releases/0.10.0", cwd=repo)
    (repo / "version.txt").write_text("release\n")
    git("commit", "-q", "-am", "release", cwd=repo)
    commit = git("rev-parse", "--short=8", "HEAD", cwd=repo)  # (git status shows it at git's own length)
    shown_as = git("rev-parse", "--short", "HEAD", cwd=repo)
    git("checkout", "-q", "master", cwd=repo)
    (repo / "version.txt").write_text("two\n")
    git("commit", "-q", "-am", "two", cwd=repo)
    url = f"file://{repo}"
    task(tmp_path, MINIMAL, "minimal.yaml")
    where.up("gitwd")

    def at(expected: str) -> None:  # SkyPilot's ``sky exec NAME 'git status | grep X || exit 1'``
        shown = sky("exec", "gitwd", f"git status | grep '{expected}' || exit 1", cwd=tmp_path)
        assert shown.returncode == 0, (expected, shown.stdout, shown.stderr)

    first = sky("launch", "-y", "-c", "gitwd", "--git-url", url, "minimal.yaml", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert state(tmp_path, "gitwd", 1) == (0, "Job 1: SUCCEEDED")
    at("master")
    moves = [("launch", "releases/0.10.0", "releases/0.10.0"), ("launch", None, "master"),
             ("exec", "releases/0.10.0", "releases/0.10.0"), ("exec", "v0.10.0", "v0.10.0"),
             ("exec", commit, shown_as), ("exec", None, "master")]
    # (On the SSH hosts, every other move: a launch and an exec, a branch and a commit; each move
    # costs a clone or fetch on both hosts.)
    for command, ref, expected in moves if where.provider == "local" else moves[::2]:
        moved = sky(command, *(["-y", "-c"] if command == "launch" else []), "gitwd", "--git-url", url,
                    *(["--git-ref", ref] if ref else []), "minimal.yaml", cwd=tmp_path)
        assert moved.returncode == 0, (command, ref, moved.stderr)
        at(expected)


COUNT = 'for i in $(seq 1 100000); do echo "Repeat $i"; sleep 1; done'


def followers(home: str) -> list[int]:
    """The node-side processes that follow a job's log for ``skyward logs`` on this test's Local
    clusters (their command line names the cluster's folder under the test's SKYWARD_HOME)."""
    found = subprocess.run(["pgrep", "-f", f"{home}/.* follow "], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split()]


def following(home: str, tmp_path: Path, cluster: str) -> tuple[subprocess.Popen[str], list[int]]:
    """``skyward logs CLUSTER`` running, once it has printed a line of the job; and its followers."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    logs = subprocess.Popen([sys.executable, "-m", "skyward.cli", "logs", cluster], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert logs.stdout is not None and "Repeat" in logs.stdout.readline()
    tools = followers(home)
    assert tools, "no process follows the job's log"
    return logs, tools


def test_cancel_logs_request(home: str, tmp_path: Path) -> None:
    """SkyPilot's test_cancel_logs_request (``launch -d`` for its ``--async``): ``logs`` of a job
    that prints forever, ended by SIGTERM, leaves no process behind that followed the log."""
    assert sky("launch", "-y", "-d", "-c", "cl", COUNT, cwd=tmp_path).returncode == 0
    assert cluster_status(tmp_path, "cl") == "UP"
    logs, tools = following(home, tmp_path, "cl")
    logs.terminate()
    assert logs.wait(60) != 0
    assert wait_gone(tools, 60) == [], "a process that followed the log outlived `skyward logs`"
    assert state(tmp_path, "cl", 1) == (101, "Job 1: RUNNING")  # (the job itself goes on)


def test_cancel_logs_does_not_break_process_pool(home: str, tmp_path: Path) -> None:
    """SkyPilot's test_cancel_logs_does_not_break_process_pool: ``logs`` of one cluster's job is
    killed (SIGKILL) while a second cluster launches; the launch prints its job's line and
    succeeds, and what followed the log does not outlive the killed ``logs``."""
    assert sky("launch", "-y", "-d", "-c", "cp-1", COUNT, cwd=tmp_path).returncode == 0
    logs, tools = following(home, tmp_path, "cp-1")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    launch = subprocess.Popen([sys.executable, "-m", "skyward.cli", "launch", "-y", "-c", "cp-2", "echo hi"],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    logs.kill()
    out, err = launch.communicate(timeout=180)
    assert launch.returncode == 0, err
    assert lines(out, "hi") == ["[node 0] hi"] and "Traceback" not in err
    assert wait_gone(tools, 60) == [], "a process that followed the log outlived the killed `skyward logs`"


SLEEPER = """\
resources:
  cpus: @CPUS@
run: |
  echo "job $SKYPILOT_TASK_ID"
  sleep 100000000
"""


def test_large_job_queue(home: str, tmp_path: Path) -> None:
    """SkyPilot's test_large_job_queue, scaled from 75 jobs that each take half a CPU of 8 (16 at
    once) to 7 jobs that each take half the node's CPUs (2 at once, on any machine; our
    ``resources.cpus`` counts whole CPUs): with the first 2 cancelled, the next 2 run and the last
    3 wait, in submission order; after cancelling two waiting jobs and a running one, the first
    job still waiting runs."""
    assert sky("launch", "-y", "-c", "lq", cwd=tmp_path).returncode == 0  # (a cluster, no job)
    task(tmp_path, SLEEPER, "job.yaml", **{"@CPUS@": str(len(os.sched_getaffinity(0)) // 2)})
    for n in range(1, 8):
        assert sky("exec", "lq", "-n", f"lq-{n}", "-d", "job.yaml", cwd=tmp_path).returncode == 0
    assert sky("cancel", "-y", "lq", "1", "2", cwd=tmp_path).returncode == 0
    want = {f"lq-{n}": "CANCELLED" if n <= 2 else "RUNNING" if n <= 4 else "PENDING" for n in range(1, 8)}
    until(lambda: queue_states(tmp_path, "lq") == want, 60, "jobs 3-4 RUNNING and 5-7 PENDING")
    assert sky("cancel", "-y", "lq", "5", "7", "3", cwd=tmp_path).returncode == 0
    want.update({"lq-5": "CANCELLED", "lq-7": "CANCELLED", "lq-3": "CANCELLED", "lq-6": "RUNNING"})
    until(lambda: queue_states(tmp_path, "lq") == want, 60, "job 6 to run in the place job 3 left")


def test_fast_large_job_queue(home: str, tmp_path: Path) -> None:
    """SkyPilot's test_fast_large_job_queue, scaled from 32 detached jobs to 16: each is
    scheduled as soon as it is submitted, and all succeed (``queue -a``: without it our queue
    shows the 10 most recent finished jobs, where SkyPilot's shows every one)."""
    assert sky("launch", "-y", "-c", "fq", cwd=tmp_path).returncode == 0
    for n in range(1, 17):
        assert sky("exec", "fq", "-n", f"fq-{n}", "-d", f"echo {n}", cwd=tmp_path).returncode == 0

    def states() -> dict[str, str]:
        listed = sky("queue", "fq", "-a", "--json", cwd=tmp_path)
        return {j["name"]: j["status"] for j in json.loads(listed.stdout)["fq"]}

    want = {f"fq-{n}": "SUCCEEDED" for n in range(1, 17)}
    until(lambda: states() == want, 60, "every job to succeed")


MULTINODE_JOB = """\
num_nodes: 2
resources:
  cpus: @CPUS@
setup: |
  echo "running setup"
  sleep 100000000
run: |
  echo "run on $SKYPILOT_NODE_RANK"
  sleep 100000000
"""


def test_job_queue_multinode(home: str, tmp_path: Path) -> None:
    """SkyPilot's test_job_queue_multinode, on CPUs instead of half a GPU: on a two-node cluster,
    two-node jobs that each take half of every node's CPUs; ``exec`` runs no setup, so jobs 1 and
    2 run, while job 3 (``launch -n -d``: its setup runs) waits; cancelling job 1 starts job 3's
    setup (SETTING_UP); a job cancelled while SETTING_UP is CANCELLED; ``exec --num-nodes 2``
    then runs on both nodes. (SkyPilot's ``cancel 1 2 3`` also names the finished job 1, which
    ours refuses: docs/cli.md.)"""
    assert sky("launch", "-y", "-c", "jm", "--num-nodes", "2", cwd=tmp_path).returncode == 0
    task(tmp_path, MULTINODE_JOB, "job.yaml", **{"@CPUS@": str(len(os.sched_getaffinity(0)) // 2)})
    for n in (1, 2):
        assert sky("exec", "jm", "-n", f"jm-{n}", "-d", "job.yaml", cwd=tmp_path).returncode == 0
    assert sky("launch", "-y", "-c", "jm", "-n", "jm-3", "-d", "job.yaml", cwd=tmp_path).returncode == 0
    want = {"jm-1": "RUNNING", "jm-2": "RUNNING", "jm-3": "PENDING"}
    until(lambda: queue_states(tmp_path, "jm") == want, 60, "jm-1 and jm-2 RUNNING, jm-3 PENDING")
    assert sky("cancel", "-y", "jm", "1", cwd=tmp_path).returncode == 0
    until(lambda: queue_states(tmp_path, "jm")["jm-3"] == "SETTING_UP", 60, "jm-3 to set up")
    assert sky("cancel", "-y", "jm", "2", "3", cwd=tmp_path).returncode == 0
    assert sky("launch", "-y", "-c", "jm", "-n", "jm-4", "-d", "job.yaml", cwd=tmp_path).returncode == 0
    until(lambda: queue_states(tmp_path, "jm")["jm-4"] == "SETTING_UP", 60, "jm-4 to set up")
    assert sky("cancel", "-y", "jm", "4", cwd=tmp_path).returncode == 0
    assert queue_states(tmp_path, "jm")["jm-4"] == "CANCELLED"
    both = sky("exec", "jm", "--num-nodes", "2", '[[ "$SKYPILOT_NUM_NODES" -eq 2 ]] || exit 1', cwd=tmp_path)
    assert both.returncode == 0, both.stderr
    assert state(tmp_path, "jm", 5) == (0, "Job 5: SUCCEEDED")
