"""The cluster commands as SkyPilot users type them: ``skyward launch -c``, ``exec``,
``status``, ``stop``, ``start``, ``logs`` and ``down``, through the real command line (Local
clusters), and ``launch -c`` then ``exec`` on SSH test hosts through :func:`skyward.launch.execute`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from skyward import events as ev
from skyward.clusters import manage
from skyward.launch import execute, plan
from tests.conftest import pid_alive, wait_gone
from tests.hosts.conftest_fixture import ssh_provider

ROOT = Path(__file__).resolve().parents[1]

TASK = """\
name: hello
num_nodes: 2
envs:
  GREETING: hi
setup: |
  echo "setup ran on node $SKYPILOT_NODE_RANK (@TAG@)"
run: |
  echo "$GREETING from node $SKYPILOT_NODE_RANK of $SKYPILOT_NUM_NODES"
"""


@pytest.fixture
def home(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="skyc")
    monkeypatch.setenv("SKYWARD_HOME", path)
    yield path
    for record in manage.ClusterStore().all():
        manage.down(record.name)


def sky(*args: str, cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "skyward.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def task(tmp_path: Path, text: str = TASK, name: str = "task.yaml", **replace: str) -> Path:
    for old, new in replace.items():
        text = text.replace(old, new)
    path = tmp_path / name
    path.write_text(text)
    return path


def lines(out: str, containing: str) -> list[str]:
    """The nodes' output lines (not the plan's echo of the task) that hold ``containing``."""
    return sorted(line for line in out.splitlines() if line.startswith("[node") and containing in line)


def test_launch_c_creates_a_cluster_reuses_it_without_setup_and_reruns_changed_setup(home: str, tmp_path: Path) -> None:
    task(tmp_path, **{"@TAG@": "v1"})
    first = sky("launch", "-c", "dev", "task.yaml", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert len(lines(first.stdout, "setup ran on node")) == 2
    ran = lines(first.stdout, "hi from node")
    assert ran == ["[node 0] hi from node 0 of 2", "[node 1] hi from node 1 of 2"]
    workers = manage.ClusterStore().get("dev").workers

    again = sky("launch", "-c", "dev", "task.yaml", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert lines(again.stdout, "setup ran") == [], "setup ran again on a cluster that had it"
    assert lines(again.stdout, "hi from node") == ran
    assert manage.ClusterStore().get("dev").workers == workers  # the same worker processes

    task(tmp_path, **{"@TAG@": "v2"})
    changed = sky("launch", "-c", "dev", "task.yaml", cwd=tmp_path)
    assert len(lines(changed.stdout, "setup ran on node")) == 2, "a changed setup block must run again"


def test_exec_runs_only_the_run_block_on_the_existing_cluster(home: str, tmp_path: Path) -> None:
    task(tmp_path, **{"@TAG@": "x"})
    assert sky("launch", "-c", "dev", "task.yaml", cwd=tmp_path).returncode == 0
    started = time.monotonic()
    done = sky("exec", "dev", "task.yaml", "--env", "GREETING=hello", cwd=tmp_path)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert lines(done.stdout, "setup ran") == []
    assert len(lines(done.stdout, "hello from node")) == 2
    assert took < 30  # (the benchmark compares it with a bare `ssh host true`)
    missing = sky("exec", "nothing", "task.yaml", cwd=tmp_path)
    assert missing.returncode == 1 and "no cluster by this name" in missing.stderr


def test_status_lists_the_cluster_and_down_ends_it(home: str, tmp_path: Path) -> None:
    task(tmp_path, **{"@TAG@": "x"})
    assert sky("launch", "-c", "dev", "-i", "30", "task.yaml", cwd=tmp_path).returncode == 0
    table = sky("status", cwd=tmp_path)
    assert table.returncode == 0
    header, row = table.stdout.splitlines()[:2]
    assert header.split()[:5] == ["NAME", "PROVIDER", "NODES", "RESOURCES", "STATUS"]
    assert row.split()[:3] == ["dev", "local", "2"] and " UP " in f" {row} " and "30 min" in row
    [shown] = json.loads(sky("status", "--json", cwd=tmp_path).stdout)
    assert (shown["name"], shown["status"], shown["autostop_minutes"]) == ("dev", "UP", 30.0)
    pids = [pid for pid, _ in manage.ClusterStore().get("dev").workers]

    gone = sky("down", "dev", cwd=tmp_path)
    assert gone.returncode == 0, gone.stderr
    assert "cluster dev ended" in gone.stdout
    assert wait_gone(pids, 10) == []
    assert sky("status", cwd=tmp_path).stdout.strip() == "no clusters"
    neither = sky("down", "dev", cwd=tmp_path)
    assert neither.returncode == 1 and "neither a cluster" in neither.stderr


def test_stop_then_start_brings_the_cluster_back(home: str, tmp_path: Path) -> None:
    task(tmp_path, **{"@TAG@": "x"})
    assert sky("launch", "-c", "dev", "task.yaml", cwd=tmp_path).returncode == 0
    pids = [pid for pid, _ in manage.ClusterStore().get("dev").workers]
    assert sky("stop", "dev", "-y", cwd=tmp_path).returncode == 0
    assert wait_gone(pids, 10) == []
    assert [s.status for s in manage.status(["dev"])] == ["STOPPED"]
    assert sky("start", "dev", cwd=tmp_path).returncode == 0
    assert [s.status for s in manage.status(["dev"])] == ["UP"]
    ran = sky("exec", "dev", "task.yaml", cwd=tmp_path)
    assert len(lines(ran.stdout, "hi from node")) == 2


def test_a_conflicting_num_nodes_is_refused_naming_both_values(home: str, tmp_path: Path) -> None:
    task(tmp_path, **{"@TAG@": "x"})
    assert sky("launch", "-c", "dev", "task.yaml", cwd=tmp_path).returncode == 0
    refused = sky("launch", "-c", "dev", "task.yaml", "--num-nodes", "3", cwd=tmp_path)
    assert refused.returncode == 1
    assert "nodes=3 was asked, but the cluster has nodes=2" in refused.stderr
    assert "skyward down dev" in refused.stderr


def test_autostop_minutes_from_the_command_line_end_the_workers(home: str, tmp_path: Path) -> None:
    task(tmp_path, **{"@TAG@": "x"})
    assert sky("launch", "-c", "dev", "-i", "0.05", "--down", "task.yaml", cwd=tmp_path).returncode == 0
    pids = [pid for pid, _ in manage.ClusterStore().get("dev").workers]
    assert wait_gone(pids, 15) == []
    assert manage.status() == []  # --down: the cluster is gone, not stopped


def gone_from_status(name: str, timeout: float) -> bool:
    """Wait (``timeout`` at most) until ``skyward status`` no longer lists cluster ``name``."""
    deadline = time.monotonic() + timeout
    while name in {s.record.name for s in manage.status()}:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_down_alone_ends_the_cluster_once_its_run_has_finished(home: str, tmp_path: Path) -> None:
    """SkyPilot's `launch -c NAME --down` without -i: torn down when its jobs are done."""
    task(tmp_path, **{"@TAG@": "x"})
    ran = sky("launch", "-c", "dev", "--down", "task.yaml", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert len(lines(ran.stdout, "hi from node")) == 2
    pids = [pid for pid, _ in manage.ClusterStore().get("dev").workers]
    assert len(pids) == 2
    assert wait_gone(pids, 30) == [], "the cluster's workers outlived its run"
    assert gone_from_status("dev", 30)
    listed = sky("status", cwd=tmp_path)
    assert listed.returncode == 0 and listed.stdout == "no clusters\n"


HELD = """\
num_nodes: 2
run: |
  echo "started on $SKYPILOT_NODE_RANK"
  while [ ! -e "$GO" ]; do sleep 0.1; done
  echo "released on $SKYPILOT_NODE_RANK"
"""


def test_down_alone_with_a_detached_run_keeps_the_cluster_until_the_run_ends(home: str, tmp_path: Path) -> None:
    go = tmp_path / "go"
    task(tmp_path, HELD, "held.yaml")
    launched = sky("launch", "-c", "dev", "--down", "-d", "held.yaml", "--env", f"GO={go}", cwd=tmp_path)
    assert launched.returncode == 0, launched.stderr
    pids = [pid for pid, _ in manage.ClusterStore().get("dev").workers]
    time.sleep(3)  # (autostop with down checks a detached run every second: it must not end the cluster)
    assert [s.status for s in manage.status(["dev"])] == ["UP"]
    assert all(pid_alive(p) for p in pids)
    go.touch()
    followed = sky("logs", "dev", cwd=tmp_path)  # until the run ends on every node
    assert lines(followed.stdout, "released on") == ["[node 0] released on 0", "[node 1] released on 1"]
    assert wait_gone(pids, 30) == [], "the cluster outlived its detached run"
    assert gone_from_status("dev", 30)


def test_start_with_down_alone_is_refused_naming_the_flag(home: str, tmp_path: Path) -> None:
    refused = sky("start", "dev", "--down", cwd=tmp_path)  # (alone it would end the cluster as soon as it is up)
    assert refused.returncode == 1
    assert "invalid --down: expected --down with -i MIN on start" in refused.stderr


def test_cluster_flags_without_a_cluster_are_refused(home: str, tmp_path: Path) -> None:
    task(tmp_path, **{"@TAG@": "x"})
    refused = sky("launch", "-i", "5", "task.yaml", cwd=tmp_path)
    assert refused.returncode == 2 and "-i only with -c NAME" in refused.stderr


LONG = """\
num_nodes: 2
run: |
  for i in 1 2 3 4 5 6; do echo "tick $i on $SKYPILOT_NODE_RANK"; sleep 0.5; done
"""


def test_a_detached_run_goes_on_without_the_client_and_logs_follow_it(home: str, tmp_path: Path) -> None:
    task(tmp_path, LONG, "long.yaml")
    started = time.monotonic()
    launched = sky("launch", "-c", "dev", "-d", "long.yaml", cwd=tmp_path)
    assert launched.returncode == 0, launched.stderr
    assert "skyward logs dev" in launched.stderr
    assert lines(launched.stdout, "tick 6") == []  # it returned before the run ended
    followed = sky("logs", "dev", cwd=tmp_path)
    assert followed.returncode == 0
    assert lines(followed.stdout, "tick 6") == ["[node 0] tick 6 on 0", "[node 1] tick 6 on 1"]
    assert time.monotonic() - started < 60


def launch_and_exec_on(provider, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[list[str], list[str], list[int]]:
    """The setup's output lines (events) and the run's (its job's log, followed) of a launch and an exec."""
    outputs: list[list[str]] = [[], []]

    def into(i: int):
        def on_event(event: ev.Event) -> None:
            if isinstance(event, ev.TaskOutput):
                outputs[i].append(event.line)
        return on_event

    path = task(tmp_path, **{"@TAG@": "ssh"})
    p = plan(path)
    capsys.readouterr()
    assert execute(p, provider=provider, console=False, on_event=into(0), cluster={"name": "hosts"}) == 0
    outputs[0] += capsys.readouterr().out.splitlines()
    pids = [pid for pid, _ in manage.ClusterStore().get("hosts").workers]
    assert execute(plan(path), console=False, on_event=into(1), cluster={"name": "hosts", "attach_only": True},
                   run_setup=False) == 0
    outputs[1] += capsys.readouterr().out.splitlines()
    return outputs[0], outputs[1], pids


def test_launch_c_and_exec_on_ssh_hosts(home: str, tmp_path: Path, test_hosts, wheelhouse,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    provider = ssh_provider(test_hosts[:2], wheelhouse)
    first, second, pids = launch_and_exec_on(provider, tmp_path, capsys)
    assert "Job ID: 1" in first and "Job ID: 2" in second
    assert sorted(x for x in second if "hi from node" in x) == ["[node 0] hi from node 0 of 2",
                                                                 "[node 1] hi from node 1 of 2"]
    assert len([x for x in first if "setup ran on node" in x]) == 2
    assert sorted(x for x in first if "hi from node" in x) == sorted(x for x in second if "hi from node" in x)
    assert not [x for x in second if "setup ran" in x]
    assert all(pid_alive(p) for p in pids)  # (the hosts share this machine's process ids)
    assert manage.down("hosts") == []
    assert wait_gone(pids, 10) == []


def test_the_mingpt_recipes_command_lines_work_as_skypilot_users_type_them(home: str) -> None:
    """SkyPilot's minGPT recipe: `sky launch -c train train.yaml`, again on the same cluster,
    and the scale-up line (a dry run: it would rent machines), with `skyward` for `sky`."""
    first = sky("launch", "-c", "train", "examples/mingpt/train.yaml", "--env", "MINGPT_STEPS=3", cwd=ROOT)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    assert "[node 0] mingpt: done: 3 steps across 2 rank(s)" in first.stdout
    workers = manage.ClusterStore().get("train").workers
    again = sky("launch", "-c", "train", "examples/mingpt/train.yaml", "--env", "MINGPT_STEPS=3", cwd=ROOT)
    assert again.returncode == 0 and "weights identical on every rank" in again.stdout
    assert manage.ClusterStore().get("train").workers == workers
    scaled = sky("launch", "-c", "train2", "examples/mingpt/train.yaml", "--num-nodes", "4", "--gpus", "L4:4",
                 "--cpus", "8+", "--provider", "aws", "--dryrun", cwd=ROOT)
    assert scaled.returncode == 0, scaled.stderr
    assert "4 node(s) on aws" in scaled.stdout and "dry run: nothing was started" in scaled.stdout
    assert manage.ClusterStore().get("train2") is None  # a dry run creates no cluster
