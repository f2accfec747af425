"""Managed jobs (``skyward jobs``) on the Local provider, through the real command line: a
detached controller process runs each job on a cluster of its own. A client SIGKILLed after
submitting, a cancel, a node's worker SIGKILLed (recovered from a checkpoint), the controller
SIGKILLed mid-job, unknown ids. Afterwards nothing of the job is left: no cluster, no process but
the controller (every process of the test's skyward home is counted)."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from skyward.clusters.state import ClusterStore
from skyward.jobs import client, controller
from skyward.errors import ClusterError
from skyward.jobs.store import JobStore, folder
from tests.conftest import pid_alive, wait_gone
from tests.leftovers import cluster_home
from tests.test_cluster_cli import ROOT, sky, task
from tests.test_cluster_jobs import until

HELD = """\
name: held
run: |
  echo $$ > "$OUT/pid"
  echo "$SKYPILOT_TASK_ID" >> "$OUT/task_ids"
  n=$(cat "$OUT/ckpt" 2>/dev/null || echo 0)
  echo "resuming at $n"
  [ "$n" -ge 1 ] || echo 1 > "$OUT/ckpt"
  while [ ! -e "$OUT/go" ]; do sleep 0.1; done
  echo 2 > "$OUT/ckpt"
  echo "finished from $n"
"""


@pytest.fixture
def home(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A skyward home of the test's own; its controller (and launchers) ended afterwards, then
    its clusters (tests.leftovers.cluster_home)."""
    with cluster_home(monkeypatch, "skym") as path:
        try:
            yield path
        finally:
            assert controller.stop() == [], "the controller or a launcher did not end"


def home_processes(home: str) -> list[int]:
    """Every live process started with this skyward home: controller, launchers, cluster
    workers, the jobs' own processes."""
    needle = f"SKYWARD_HOME={home}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or not pid_alive(int(entry)):
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def submit(tmp_path: Path, text: str = HELD, name: str = "job.yaml") -> int:
    """``skyward jobs launch -d``, the client SIGKILLed as soon as it has printed the id."""
    task(tmp_path, text, name)
    (tmp_path / "out").mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "skyward.cli", "jobs", "launch", name, "-d", "-y",
                             "--env", f"OUT={tmp_path / 'out'}"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            if line.startswith("Managed job ID: "):
                return int(line.split()[-1])
        raise AssertionError(f"no job id: {proc.communicate()}")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def state(job: int) -> str:
    return client.get(job).status


def nothing_left(home: str) -> None:
    """No cluster, and no process of this home but its controller."""
    assert ClusterStore().all() == []
    leader = controller.running()
    assert leader is not None
    left = until(lambda: home_processes(home) == [leader] or None, 30, "the job's processes to end")
    assert left


def test_a_detached_job_outlives_its_killed_client_succeeds_and_leaves_nothing(home: str, tmp_path: Path) -> None:
    job = submit(tmp_path)
    assert job == 1
    until(lambda: (tmp_path / "out" / "ckpt").exists(), 60, "the job to run")
    (tmp_path / "out" / "go").touch()
    ended = client.wait(job, 60)
    assert (ended.status, ended.exit_code, ended.recoveries) == ("SUCCEEDED", 0, 0)
    nothing_left(home)
    table = sky("jobs", "queue", cwd=tmp_path).stdout.splitlines()
    assert table[1].split("  ")[0:1] == ["ID"] and [c.strip() for c in table[1].split("  ") if c.strip()] == [
        "ID", "NAME", "RESOURCES", "SUBMITTED", "TOT. DURATION", "JOB DURATION", "#RECOVERIES", "STATUS"]
    assert table[2].split()[:3] == ["1", "held", "1x[CPU:0.5]"] and table[2].split()[-2:] == ["0", "SUCCEEDED"]
    logs = sky("jobs", "logs", "1", "--no-follow", cwd=tmp_path)
    assert logs.returncode == 0 and "[node 0] resuming at 0" in logs.stdout and "finished from 0" in logs.stdout
    finished = sky("jobs", "cancel", "1", "-y", cwd=tmp_path)
    assert finished.returncode == 1 and "job 1 is SUCCEEDED" in finished.stderr


def test_cancel_ends_the_running_job_its_processes_and_its_cluster(home: str, tmp_path: Path) -> None:
    job = submit(tmp_path)
    until(lambda: (tmp_path / "out" / "pid").exists(), 60, "the job to run")
    script = int((tmp_path / "out" / "pid").read_text())
    assert ClusterStore().get(f"sky-managed-{job}") is not None
    cancelled = sky("jobs", "cancel", str(job), "-y", cwd=tmp_path)
    assert cancelled.returncode == 0, cancelled.stderr
    assert f"managed job {job} CANCELLED" in cancelled.stdout
    assert wait_gone([script], 10) == []
    assert state(job) == "CANCELLED"
    nothing_left(home)
    shown = json.loads(sky("jobs", "queue", "--json", cwd=tmp_path).stdout)
    assert [(j["id"], j["status"]) for j in shown] == [(job, "CANCELLED")]


SLOW_SETUP = """\
setup: |
  echo $$ > "$OUT/setup_pid"
  while [ ! -e "$OUT/go" ]; do sleep 0.1; done
run: echo never
"""


def test_cancel_during_setup_interrupts_the_launch_and_leaves_nothing(home: str, tmp_path: Path) -> None:
    job = submit(tmp_path, SLOW_SETUP)
    until(lambda: (tmp_path / "out" / "setup_pid").exists(), 60, "setup to run")
    setup = int((tmp_path / "out" / "setup_pid").read_text())
    assert state(job) == "STARTING"
    cancelled = sky("jobs", "cancel", "--all", "-y", cwd=tmp_path)
    assert cancelled.returncode == 0, cancelled.stderr
    assert f"managed job {job} CANCELLED" in cancelled.stdout
    assert wait_gone([setup], 10) == []
    nothing_left(home)


def test_a_lost_node_is_recovered_and_the_run_resumes_from_its_checkpoint(home: str, tmp_path: Path) -> None:
    job = submit(tmp_path)
    until(lambda: (tmp_path / "out" / "ckpt").exists() and state(job) == "RUNNING", 60, "the job to run")
    workers = ClusterStore().get(f"sky-managed-{job}").workers
    os.kill(workers[0][0], signal.SIGKILL)  # the node's worker, and with it the run
    until(lambda: client.get(job).recoveries == 1, 30, "the controller to see the node lost")
    (tmp_path / "out" / "go").touch()
    ended = client.wait(job, 60)
    assert (ended.status, ended.recoveries) == ("SUCCEEDED", 1)
    ids = (tmp_path / "out" / "task_ids").read_text().split()
    assert len(ids) == 2 and ids[0] == ids[1] == ended.task_id  # the same SKYPILOT_TASK_ID
    nothing_left(home)
    logs = sky("jobs", "logs", str(job), cwd=tmp_path).stdout
    assert "resuming at 0" in logs and "resuming at 1" in logs and "finished from 1" in logs
    said = sky("jobs", "logs", str(job), "--controller", "--no-follow", cwd=tmp_path).stdout
    assert "RECOVERING: a node was lost" in said
    assert sky("jobs", "queue", cwd=tmp_path).stdout.splitlines()[2].split()[-2:] == ["1", "SUCCEEDED"]
    timeline = [(e.kind, e.text) for e in ClusterStore().events(f"sky-managed-{job}")]  # (kept past its down)
    recovered = [t for k, t in timeline if k == "recovery"]
    assert len(recovered) == 1 and recovered[0].startswith(f"managed job {job} (held) recovers: a node was lost")
    assert [k for k, _ in timeline].count("launch") == 2 and timeline[-1][0] == "down"


def test_a_killed_controller_is_started_again_and_takes_its_job_up(home: str, tmp_path: Path) -> None:
    job = submit(tmp_path)
    until(lambda: state(job) == "RUNNING", 60, "the job to run")
    first = controller.running()
    assert first is not None
    os.kill(first, signal.SIGKILL)
    assert wait_gone([first], 10) == []
    (tmp_path / "out" / "go").touch()
    until(lambda: (tmp_path / "out" / "ckpt").read_text().strip() == "2", 30, "the run to finish")
    assert state(job) == "RUNNING" and controller.running() is None  # (no one has looked yet)
    listed = sky("jobs", "queue", cwd=tmp_path)
    assert listed.returncode == 0
    second = controller.running()
    assert second not in (None, first)
    assert client.wait(job, 60).status == "SUCCEEDED"
    nothing_left(home)


FLAKY = """\
resources:
  job_recovery: {max_restarts_on_errors: 1}
run: |
  n=$(( $(cat "$OUT/attempts" 2>/dev/null || echo 0) + 1 )); echo $n > "$OUT/attempts"
  echo "attempt $n"
  [ $n -ge 2 ] || exit 4
"""


def test_failed_runs_restart_as_job_recovery_says_else_end_failed_and_torn_down(home: str, tmp_path: Path) -> None:
    flaky = submit(tmp_path, FLAKY, "flaky.yaml")
    failing = submit(tmp_path, "run: exit 7\n", "failing.yaml")
    bad_setup = submit(tmp_path, "setup: exit 3\nrun: echo never\n", "setup.yaml")
    ended = {job: client.wait(job, 60) for job in (flaky, failing, bad_setup)}
    assert (ended[flaky].status, ended[flaky].recoveries) == ("SUCCEEDED", 1)
    assert (tmp_path / "out" / "attempts").read_text().strip() == "2"
    assert (ended[failing].status, ended[failing].exit_code, ended[failing].recoveries) == ("FAILED", 7, 0)
    assert ended[bad_setup].status == "FAILED_SETUP" and "setup failed" in (ended[bad_setup].reason or "")
    nothing_left(home)
    assert sky("jobs", "logs", str(failing), cwd=tmp_path).returncode == 100
    assert "restart 1 of max_restarts_on_errors=1" in sky("jobs", "logs", str(flaky), "--controller",
                                                          cwd=tmp_path).stdout


def test_a_controller_killed_while_launching_waits_for_the_launch_it_left(home: str, tmp_path: Path) -> None:
    job = submit(tmp_path, SLOW_SETUP.replace("run: echo never", "run: echo ran > \"$OUT/ran\""))
    until(lambda: (tmp_path / "out" / "setup_pid").exists(), 60, "setup to run")
    first = controller.running()
    assert first is not None and state(job) == "STARTING"
    os.kill(first, signal.SIGKILL)
    assert wait_gone([first], 10) == []
    assert sky("jobs", "queue", cwd=tmp_path).returncode == 0  # a new controller, the launch still going
    assert controller.running() not in (None, first)
    (tmp_path / "out" / "go").touch()
    ended = client.wait(job, 60)
    assert (ended.status, ended.attempt) == ("SUCCEEDED", 1)  # the launch it found, not a second one
    assert (tmp_path / "out" / "ran").read_text().strip() == "ran"
    said = sky("jobs", "logs", str(job), "--controller", cwd=tmp_path).stdout
    assert "without a result" not in said and "teardown of" not in said, said  # it let the launch be
    nothing_left(home)


def test_unknown_ids_name_the_jobs_there_are(home: str, tmp_path: Path) -> None:
    for command in (["logs", "4"], ["cancel", "4", "-y"]):
        missing = sky("jobs", *command, cwd=tmp_path)
        assert missing.returncode == 1
        assert "invalid ID: expected a managed job's id (there are no managed jobs" in missing.stderr
        assert "got 4" in missing.stderr
    both = sky("jobs", "cancel", "--all", "-n", "x", cwd=tmp_path)
    assert both.returncode == 1 and "job ids, -n NAME or --all (one of them)" in both.stderr
    assert controller.running() is None  # (no job: no controller started)


def holds_open(pid: int, path: Path) -> bool:
    """Whether process ``pid`` has ``path`` open."""
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}") == str(path) for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


def test_a_look_at_the_lock_as_the_controller_starts_does_not_turn_it_away(home: str) -> None:
    """Every ``running()`` (each ``skyward jobs`` command, the dashboard, the start's own helper
    polling every 20 ms) holds the controller's lock shared for a moment. A controller starting in
    that moment took the look for another controller and exited, and its submit failed with "did
    not start" (seen once in a full suite run). It waits for the look to end instead."""
    lock = folder() / "controller.lock"
    looking = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(looking, fcntl.LOCK_SH)
    started = subprocess.Popen([sys.executable, "-m", "skyward.jobs.controller"], cwd=ROOT,
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        until(lambda: started.poll() is not None or holds_open(started.pid, lock), 60, "the controller to open its lock")
        assert started.poll() is None, "the controller took a look at its lock for another controller and exited"
        fcntl.flock(looking, fcntl.LOCK_UN)
        until(lambda: started.poll() is not None or controller.running() == started.pid, 60, "the controller's lock")
        assert started.poll() is None and controller.running() == started.pid
    finally:
        os.close(looking)
        assert controller.stop() == []
        if started.poll() is None:
            started.kill()
        started.wait(timeout=60)


def test_a_controller_that_cannot_start_is_an_error_that_quotes_its_log(home: str, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKYWARD_JOBS_CONTROLLER_IDLE", "soon")  # (the controller's setting, read as it starts)
    task(tmp_path, "run: echo hi\n", "job.yaml")
    failed = sky("jobs", "launch", "job.yaml", "-d", cwd=tmp_path)
    assert failed.returncode == 1 and "Managed job ID" not in failed.stdout
    assert "the managed jobs' controller exited with status 1 as it started" in failed.stderr
    assert "could not convert string to float: 'soon'" in failed.stderr
    assert f"see {home}/managed/controller.log" in failed.stderr and controller.running() is None
    assert client.jobs() == []  # nothing submitted


def test_a_controller_named_but_not_there_or_unreachable_is_a_clear_error(home: str, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from skyward.clusters.state import ClusterRecord
    from skyward.machine import Instance, SSHAddress
    from skyward.providers.ssh import SSH

    monkeypatch.setenv("SKYWARD_JOBS_CONTROLLER", "ctl")
    missing = sky("jobs", "queue", cwd=tmp_path)
    assert missing.returncode == 1 and ("invalid SKYWARD_JOBS_CONTROLLER: expected 'aws' (the controller on an AWS "
                                        "instance), 'local' (this machine's), or the name of a one-node named "
                                        "cluster of this machine") in missing.stderr
    assert "(none: make one on the host with sky.ComputePool(name=NAME, provider=sky.SSH([HOST])))" in missing.stderr
    assert "got 'ctl'" in missing.stderr
    # A cluster whose host does not answer (TEST-NET-1: no such host answers)
    gone = SSHAddress("192.0.2.1", "me", connect_timeout=1.0)
    ClusterStore().put(ClusterRecord("ctl", "c0ffee", SSH(["me@192.0.2.1"]), "ssh", 1, 1, 1, "thread", None,
                                     (Instance("192.0.2.1", 0, "192.0.2.1", ssh=gone),), pythons=("/usr/bin/python3",),
                                     roots=("/tmp",), status="UP"))
    with pytest.raises(ClusterError, match=r"(?s)the managed jobs' controller on cluster ctl \(me@192.0.2.1\) "
                                               r"cannot be asked \(.*192.0.2.1.*\); check that the host is up"):
        client.jobs()
    ClusterStore().remove("ctl")


FAILS_ON_GO = """\
run: |
  echo $$ > "$OUT/pid"
  while [ ! -e "$OUT/go" ]; do sleep 0.1; done
  exit 5
"""


def test_a_job_the_controller_cannot_handle_ends_failed_controller_with_its_cluster_down(home: str,
                                                                                        tmp_path: Path) -> None:
    running = submit(tmp_path, FAILS_ON_GO)
    until(lambda: (tmp_path / "out" / "pid").exists() and state(running) == "RUNNING", 60, "the job to run")
    store = JobStore()
    store.update(running, plan=b"not a plan")  # (what its failed run is checked against is unreadable)
    unreadable = store.add("unreadable", "1x[CPU:0.5]", b"not a plan", str(tmp_path))  # (its launch cannot start)
    controller.wake()
    (tmp_path / "out" / "go").touch()
    for job, why in ((running, "UnpicklingError"), (unreadable, "the launcher (pid")):
        ended = client.wait(job, 60)
        assert ended.status == "FAILED_CONTROLLER" and why in (ended.reason or ""), ended
        said = sky("jobs", "logs", str(job), "--controller", "--no-follow", cwd=tmp_path)
        assert said.returncode == 100 and "UnpicklingError" in said.stdout
        assert "controller error (3 of 3 in a row)" in said.stdout and "FAILED_CONTROLLER: the controller failed on it" \
            in said.stdout, said.stdout
    assert "cluster sky-managed-1 torn down" in sky("jobs", "logs", "1", "--controller", cwd=tmp_path).stdout
    nothing_left(home)


def test_a_controller_on_a_clusters_node_counts_as_a_running_job_there_until_it_ends(
        home: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the cluster worker's autostop reads (``running_jobs``) sees the controller that runs
    on its node, so an idle controller cluster stops only once its controller has ended."""
    from skyward.jobs.controller import CLUSTER_USE
    from skyward.runtime.cluster import CLUSTER_DIR, running_jobs

    monkeypatch.setenv(CLUSTER_USE, str(tmp_path / "worker"))  # (as skyward.jobs.remote sets it, over SSH)
    pid = controller.ensure()
    monkeypatch.setenv(CLUSTER_DIR, str(tmp_path / "worker"))  # (as the cluster's worker has it)
    until(lambda: running_jobs() == [pid], 30, "the controller to count as a job of the cluster")
    assert controller.stop() == []
    assert running_jobs() == []
