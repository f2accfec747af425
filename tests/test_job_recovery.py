"""``skyward launch`` honours SkyPilot's ``resources.job_recovery``: a node lost during the run is
replaced and the run starts again on every node (setup on the new node only, the same
``SKYPILOT_TASK_ID``), so a run that resumes from its own checkpoint finishes the job; a failed
run starts again up to ``max_restarts_on_errors`` times, or on a listed exit code."""

from __future__ import annotations

import contextlib
import os
import signal
import textwrap
import threading
import time
from io import StringIO
from pathlib import Path

import pytest

from skyward import events as ev
from skyward.launch import execute, plan
from tests.conftest import pid_alive


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "task.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def launch(task: Path) -> tuple[int, list[tuple[int, str]], str]:
    lines: list[tuple[int, str]] = []

    def on_event(event: ev.Event) -> None:
        if isinstance(event, ev.TaskOutput):
            lines.append((event.node, event.line))

    err = StringIO()
    code = execute(plan(task), console=False, on_event=on_event, err=err)
    return code, lines, err.getvalue()


# Node 1 fails its first two attempts with exit code 4; every attempt notes the task id.
FLAKY = """
    num_nodes: 2
    resources:
      job_recovery: {recovery}
    run: |
      f={tmp}/attempts-$SKYPILOT_NODE_RANK
      n=$(( $(cat $f 2>/dev/null || echo 0) + 1 )); echo $n > $f
      echo "$SKYPILOT_TASK_ID" >> {tmp}/task-ids
      echo "attempt $n"
      if [ "$SKYPILOT_NODE_RANK" = 1 ] && [ $n -lt 3 ]; then exit 4; fi
"""


@pytest.mark.parametrize(("recovery", "code", "restarts"), [
    ("{max_restarts_on_errors: 2}", 0, 2),  # enough restarts: the third attempt succeeds
    ("{max_restarts_on_errors: 1}", 4, 1),  # one restart only: the second failure is the result
    ("{recover_on_exit_codes: [4]}", 0, 2),  # a listed code restarts without max_restarts_on_errors
    ("FAILOVER", 4, 0),  # recovery from lost nodes only: a failed run is not restarted
])
def test_a_failed_run_starts_again_on_every_node_as_job_recovery_says(
        tmp_path: Path, recovery: str, code: int, restarts: int) -> None:
    done, lines, err = launch(write(tmp_path, FLAKY.format(recovery=recovery, tmp=tmp_path)))
    assert done == code, err
    assert err.count("skyward: job recovery: the run failed on node 1 (exit code 4)") == restarts, err
    assert (tmp_path / "attempts-1").read_text().strip() == str(restarts + 1)
    # Every attempt ran on every node, with one task id throughout.
    assert [line for node, line in lines if node == 0] == [f"attempt {n}" for n in range(1, restarts + 2)]
    ids = (tmp_path / "task-ids").read_text().split()
    assert len(ids) >= 2 * restarts + 1 and len(set(ids)) == 1, ids


# Counts to 30 in steps of 0.1 s, keeping its count in a checkpoint file of its node, and
# resuming from it. Setup leaves a line per run in a log, so the test sees where it ran.
RESUMING = """
    num_nodes: 2
    resources:
      job_recovery: FAILOVER
    setup: echo "setup on $SKYPILOT_NODE_RANK" >> {tmp}/setup.log
    run: |
      echo "$SKYPILOT_TASK_ID" >> {tmp}/runs-$SKYPILOT_NODE_RANK
      python - <<'EOF'
      import os, time
      rank = os.environ["SKYPILOT_NODE_RANK"]
      ckpt = "{tmp}/ckpt-" + rank
      step = int(open(ckpt).read()) if os.path.exists(ckpt) else 0
      print("resuming at", step, flush=True)
      open("{tmp}/shell-" + rank, "w").write(str(os.getppid()))
      open("{tmp}/shells", "a").write(str(os.getppid()) + "\\n")
      while step < 30:
          time.sleep(0.1)
          step += 1
          with open(ckpt + ".tmp", "w") as f:
              f.write(str(step))
          os.replace(ckpt + ".tmp", ckpt)
      print("finished at", step, flush=True)
      EOF
"""


def _worker_above(pid: int) -> int:
    """The skyward worker process that ``pid`` descends from (its command, through a guardian)."""
    while pid > 1:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"skyward.worker" in f.read():
                return pid
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    raise AssertionError("no skyward worker above the command")


def test_a_node_lost_during_the_run_is_replaced_and_the_run_resumes_to_the_end(tmp_path: Path) -> None:
    task = write(tmp_path, RESUMING.format(tmp=tmp_path))
    killed: list[int] = []
    workers: set[int] = set()
    finished = threading.Event()

    def watch_and_kill_node_1_midway() -> None:
        """Note every node's worker, and SIGKILL node 1's once it is 10 steps in."""
        while not finished.wait(0.05):
            with contextlib.suppress(OSError):
                shells = (tmp_path / "shells").read_text().split()
                for shell in shells:
                    with contextlib.suppress(OSError, ValueError, AssertionError):  # (one that ended)
                        workers.add(_worker_above(int(shell)))
            with contextlib.suppress(OSError, ValueError, AssertionError):
                if not killed and int((tmp_path / "ckpt-1").read_text()) >= 10:
                    worker = _worker_above(int((tmp_path / "shell-1").read_text()))
                    os.kill(worker, signal.SIGKILL)
                    killed.append(worker)

    killer = threading.Thread(target=watch_and_kill_node_1_midway, daemon=True)
    killer.start()
    try:
        code, lines, err = launch(task)
    finally:
        finished.set()
        killer.join(10)
    assert killed, "node 1's worker was never killed"
    assert code == 0, err
    assert err.count("skyward: job recovery: node 1 was lost during the run") == 1, err
    # Node 1 resumed from its checkpoint (not from 0), and both nodes finished the count.
    resumed = [line for node, line in lines if node == 1 and line.startswith("resuming at")]
    assert resumed[0] == "resuming at 0" and int(resumed[-1].split()[-1]) >= 10, resumed
    for node in (0, 1):
        assert (node, "finished at 30") in lines, lines
        runs = (tmp_path / f"runs-{node}").read_text().splitlines()
        assert len(runs) == 2 and len(set(runs)) == 1, runs  # the same task id
    # Nothing is left: the workers of both runs (the first two, the replacement) are gone.
    assert len(workers) >= 4 and not [pid for pid in workers if pid_alive(pid)], workers
    # Setup ran on each node at first, then on the replacement only.
    assert sorted((tmp_path / "setup.log").read_text().splitlines()) == ["setup on 0", "setup on 1", "setup on 1"]


def test_ssh_hosts_beyond_num_nodes_are_the_spares_a_recovery_takes(tmp_path: Path) -> None:
    from skyward.launch import make_provider

    hosts = ["me@192.0.2.1", "me@192.0.2.2", "me@192.0.2.3"]
    recovering = plan(write(tmp_path, "num_nodes: 2\nresources: {job_recovery: FAILOVER}\nrun: echo\n"),
                      provider="ssh", hosts=hosts)
    assert "me@192.0.2.1, me@192.0.2.2; spare for job recovery: me@192.0.2.3" in recovering.describe()
    assert len(make_provider(recovering).hosts) == 3
    plain = plan(write(tmp_path, "num_nodes: 2\nrun: echo\n"), provider="ssh", hosts=hosts)
    assert "spare" not in plain.describe() and len(make_provider(plain).hosts) == 2
