"""The cluster commands as SkyPilot users type them: ``skyward launch -c``, ``exec``,
``status``, ``stop``, ``start``, ``logs`` and ``down``, through the real command line (Local
clusters), and ``launch -c`` then ``exec`` on SSH test hosts through :func:`skyward.launch.execute`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from skyward import events as ev
from skyward.clusters import manage
from skyward.launch import execute, plan
from tests.conftest import free_port, pid_alive, wait_gone
from tests.hosts.conftest_fixture import kept_bashrcs, ssh_provider
from tests.leftovers import cluster_home

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
    """A SKYWARD_HOME of the test's own: see tests.leftovers.cluster_home."""
    with cluster_home(monkeypatch, "skyc") as path:
        yield path


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


def test_launch_c_fast_reuses_the_cluster_without_setup_and_reruns_changed_setup(home: str, tmp_path: Path) -> None:
    task(tmp_path, **{"@TAG@": "v1"})
    first = sky("launch", "-c", "dev", "task.yaml", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert len(lines(first.stdout, "setup ran on node")) == 2
    ran = lines(first.stdout, "hi from node")
    assert ran == ["[node 0] hi from node 0 of 2", "[node 1] hi from node 1 of 2"]
    workers = manage.ClusterStore().get("dev").workers

    again = sky("launch", "-c", "dev", "--fast", "task.yaml", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert lines(again.stdout, "setup ran") == [], "setup ran again on a cluster that had it"
    assert lines(again.stdout, "hi from node") == ran
    assert manage.ClusterStore().get("dev").workers == workers  # the same worker processes

    task(tmp_path, **{"@TAG@": "v2"})
    changed = sky("launch", "-c", "dev", "--fast", "task.yaml", cwd=tmp_path)
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
    assert row.split()[:3] == ["dev", "local", "2"] and " UP " in f" {row} "
    assert row[header.index("AUTOSTOP"):].split()[0] == "30m", row  # SkyPilot's style: 30m, 10m (down), -
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


def test_autostop_command_sets_a_live_autostop_on_a_cluster_made_without_one(home: str, tmp_path: Path) -> None:
    """SkyPilot's `sky autostop NAME -i N`: the running workers take the new limit at once."""
    task(tmp_path, **{"@TAG@": "x"})
    assert sky("launch", "-c", "dev", "task.yaml", cwd=tmp_path).returncode == 0
    pids = [pid for pid, _ in manage.ClusterStore().get("dev").workers]
    assert manage.ClusterStore().get("dev").idle_minutes is None
    set_ = sky("autostop", "dev", "-i", "0.05", "-y", cwd=tmp_path)  # 3 s
    assert set_.returncode == 0, set_.stderr
    assert "cluster dev: autostop after 0.05m idle" in set_.stdout
    assert manage.ClusterStore().get("dev").idle_minutes == 0.05
    assert wait_gone(pids, 30) == [], "the workers did not take the autostop set on them"
    assert [s.status for s in manage.status(["dev"])] == ["STOPPED"]


def test_autostop_cancel_keeps_the_cluster_up_past_its_old_limit(home: str, tmp_path: Path) -> None:
    task(tmp_path, **{"@TAG@": "x"})
    assert sky("launch", "-c", "dev", "-i", "0.1", "task.yaml", cwd=tmp_path).returncode == 0  # 6 s
    pids = [pid for pid, _ in manage.ClusterStore().get("dev").workers]
    cancelled = sky("autostop", "dev", "--cancel", "-y", cwd=tmp_path)
    assert cancelled.returncode == 0, cancelled.stderr
    assert "cluster dev: autostop cancelled" in cancelled.stdout
    time.sleep(6 + 3)  # (a bounded negative check: the old limit and a margin)
    assert all(pid_alive(p) for p in pids), "a cancelled autostop still fired"
    header, row = sky("status", "dev", cwd=tmp_path).stdout.splitlines()[:2]
    assert " UP " in f" {row} " and row[header.index("AUTOSTOP"):].split()[0] == "-"


def test_autostop_command_refuses_bad_input_naming_the_flag(home: str, tmp_path: Path) -> None:
    unknown = sky("autostop", "nothing", "-i", "5", "-y", cwd=tmp_path)
    assert unknown.returncode == 1 and "nothing" in unknown.stderr and "no cluster by this name" in unknown.stderr
    negative = sky("autostop", "nothing", "-i", "-1", "-y", cwd=tmp_path)
    assert negative.returncode == 1
    assert "invalid -i: expected a number of idle minutes >= 0" in negative.stderr and "-1" in negative.stderr
    both = sky("autostop", "nothing", "-i", "5", "--cancel", "-y", cwd=tmp_path)
    assert both.returncode == 1 and "invalid --cancel: expected --cancel alone" in both.stderr
    word = sky("autostop", "nothing", "-i", "soon", cwd=tmp_path)
    assert word.returncode == 2 and "-i" in word.stderr and "soon" in word.stderr


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
    # The command line's exec of a command: the job's output, followed over the attach's own
    # connections, and no import that path does not need (paramiko's invoke: see skyward._optional).
    cli = subprocess.run([sys.executable, "-X", "importtime", "-m", "skyward.cli", "exec", "hosts", "--num-nodes", "2",
                          "echo cli on $SKYPILOT_NODE_RANK"], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=180)
    assert cli.returncode == 0, cli.stderr[-3000:]
    assert lines(cli.stdout, "cli on") == ["[node 0] cli on 0", "[node 1] cli on 1"]
    imported = {line.rsplit("|", 1)[1].strip() for line in cli.stderr.splitlines() if line.startswith("import time:")}
    packages = {m.split(".")[0] for m in imported}
    assert "paramiko" in packages and "invoke" not in packages
    # (nor pydantic: the attach's pool options and Image() are plainly valid, see skyward.pool.options;
    # nor the AWS provider, for the task's default cloud, that the attach never used; nor tarfile: no
    # files are sent)
    assert "pydantic" not in packages
    assert not {m for m in imported if m.startswith("skyward.providers.aws")} and "tarfile" not in imported
    assert manage.down("hosts") == []
    assert wait_gone(pids, 10) == []


def test_the_mingpt_recipes_command_lines_work_as_skypilot_users_type_them(home: str) -> None:
    """SkyPilot's minGPT recipe: `sky launch -c train train.yaml`, again on the same cluster,
    and the scale-up line (a dry run: it would rent machines), with `skyward` for `sky`."""
    port = f"MINGPT_PORT={free_port()}"  # other test files may run the example at the same time
    first = sky("launch", "-c", "train", "examples/mingpt/train.yaml", "--env", "MINGPT_STEPS=3", "--env", port,
                cwd=ROOT)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    assert "[node 0] mingpt: done: 3 steps across 2 rank(s)" in first.stdout
    workers = manage.ClusterStore().get("train").workers
    again = sky("launch", "-c", "train", "examples/mingpt/train.yaml", "--env", "MINGPT_STEPS=3", "--env", port,
                cwd=ROOT)
    assert again.returncode == 0 and "weights identical on every rank" in again.stdout
    assert manage.ClusterStore().get("train").workers == workers
    scaled = sky("launch", "-c", "train2", "examples/mingpt/train.yaml", "--num-nodes", "4", "--gpus", "L4:4",
                 "--cpus", "8+", "--provider", "aws", "--dryrun", cwd=ROOT)
    assert scaled.returncode == 0, scaled.stderr
    assert "4 node(s) on aws" in scaled.stdout and "dry run: nothing was started" in scaled.stdout
    assert manage.ClusterStore().get("train2") is None  # a dry run creates no cluster


# -- SkyPilot's environment and behaviour on a cluster ------------------------------------------


def sky_home(*args: str, cwd: Path, home: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """``sky`` with ``HOME`` a temporary folder (the Local nodes' home is the client's)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "skyward.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


FAILED_WORKER_SETUP = """\
num_nodes: 2
setup: |
  echo "setup on $SKYPILOT_SETUP_NODE_RANK"
  if [ "$SKYPILOT_SETUP_NODE_RANK" = 1 ]; then echo "worker setup fails"; exit 7; fi
  if [ "$SKYPILOT_SETUP_NODE_RANK" = 0 ]; then sleep 120; fi
run: |
  echo "run ran on $SKYPILOT_NODE_RANK"
"""


def test_a_setup_that_fails_on_a_worker_only_fails_the_launch(home: str, tmp_path: Path) -> None:
    task(tmp_path, FAILED_WORKER_SETUP, "bad.yaml")
    started = time.monotonic()
    done = sky("launch", "-c", "dev", "bad.yaml", cwd=tmp_path)
    assert done.returncode == 100, (done.stdout, done.stderr)  # the job is FAILED_SETUP (SkyPilot's code)
    assert "FAILED_SETUP (node 1: exit code 7)" in done.stderr
    assert lines(done.stdout, "run ran") == []
    assert time.monotonic() - started < 60  # the head's sleep was stopped, not waited for


VARIABLES = """\
num_nodes: 2
setup: |
  ips=$(echo "$SKYPILOT_SETUP_NODE_IPS" | wc -l)
  echo "setup rank=$SKYPILOT_SETUP_NODE_RANK gpus=$SKYPILOT_SETUP_NUM_GPUS_PER_NODE ips=$ips"
run: |
  echo "user=$SKYPILOT_USER"
  echo "info=$SKYPILOT_CLUSTER_INFO"
"""


def test_the_setup_variables_cluster_info_and_user_are_skypilots(home: str, tmp_path: Path) -> None:
    import getpass

    task(tmp_path, VARIABLES, "vars.yaml")
    done = sky("launch", "-c", "dev", "vars.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert lines(done.stdout, "setup rank=") == ["[node 0] setup rank=0 gpus=1 ips=2",
                                                 "[node 1] setup rank=1 gpus=1 ips=2"]
    assert lines(done.stdout, "user=") == [f"[node 0] user={getpass.getuser()}", f"[node 1] user={getpass.getuser()}"]
    for line in lines(done.stdout, "info="):
        info = json.loads(line.split("info=", 1)[1])
        assert info["cluster_name"] == "dev" and info["num_nodes"] == 2
        assert info["cloud"] == "Local" and "region" in info


BASHRC = """\
num_nodes: 2
setup: |
  echo 'export FOO=bar' >> ~/.bashrc
run: |
  echo "FOO is ${FOO:-unset} on $SKYPILOT_NODE_RANK"
"""


def test_on_local_the_users_own_bashrc_stays_out_of_the_run(home: str, tmp_path: Path) -> None:
    """Local's node is this machine, set up already: its ~/.bashrc (pyenv's shims, a prompt's
    tools) is not read, so the run keeps this interpreter's environment. (SSH hosts read theirs:
    test_run_reads_the_bashrc_that_setup_wrote_on_ssh_hosts.)"""
    user_home = tmp_path / "home"
    user_home.mkdir()
    (user_home / ".bashrc").write_text("case $- in *i*) ;; *) return;; esac\nexport PATH=/nowhere:$PATH\n")
    task(tmp_path, BASHRC + "  echo \"python is $(command -v python3)\"\n", "rc.yaml")
    done = sky_home("launch", "-c", "dev", "rc.yaml", cwd=tmp_path, home=user_home)
    assert done.returncode == 0, done.stderr
    assert lines(done.stdout, "FOO is") == ["[node 0] FOO is unset on 0", "[node 1] FOO is unset on 1"]
    assert lines(done.stdout, "python is")[0].endswith(f"python is {Path(sys.executable).parent}/python3")


ONE_NODE = """\
run: |
  echo "job on $SKYPILOT_NODE_RANK of $SKYPILOT_NUM_NODES: $(echo "$SKYPILOT_NODE_IPS" | wc -l) ip(s)"
"""


def test_a_task_of_one_node_runs_on_the_head_of_a_two_node_cluster(home: str, tmp_path: Path) -> None:
    task(tmp_path, **{"@TAG@": "x"})
    assert sky("launch", "-c", "dev", "task.yaml", cwd=tmp_path).returncode == 0
    task(tmp_path, ONE_NODE, "one.yaml")
    launched = sky("launch", "-c", "dev", "one.yaml", cwd=tmp_path)
    assert launched.returncode == 0, launched.stderr
    assert lines(launched.stdout, "job on") == ["[node 0] job on 0 of 1: 1 ip(s)"]
    ran = sky("exec", "dev", "one.yaml", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert lines(ran.stdout, "job on") == ["[node 0] job on 0 of 1: 1 ip(s)"]


def test_launch_again_runs_setup_again_and_fast_skips_it(home: str, tmp_path: Path) -> None:
    task(tmp_path, **{"@TAG@": "x"})
    assert len(lines(sky("launch", "-c", "dev", "task.yaml", cwd=tmp_path).stdout, "setup ran on node")) == 2
    again = sky("launch", "-c", "dev", "task.yaml", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert len(lines(again.stdout, "setup ran on node")) == 2, "plain launch -c runs setup again, as SkyPilot's"
    fast = sky("launch", "-c", "dev", "--fast", "task.yaml", cwd=tmp_path)
    assert fast.returncode == 0, fast.stderr
    assert lines(fast.stdout, "setup ran on node") == []
    assert len(lines(fast.stdout, "hi from node")) == 2


FAILING_RUN = """\
num_nodes: 2
run: |
  echo "ending on $SKYPILOT_NODE_RANK"
  if [ "$SKYPILOT_NODE_RANK" = 1 ]; then exit 5; fi
"""


def test_logs_after_a_failed_run_exits_non_zero(home: str, tmp_path: Path) -> None:
    task(tmp_path, FAILING_RUN, "fails.yaml")
    assert sky("launch", "-c", "dev", "-d", "fails.yaml", cwd=tmp_path).returncode == 0
    followed = sky("logs", "dev", cwd=tmp_path)
    assert lines(followed.stdout, "ending on") == ["[node 0] ending on 0", "[node 1] ending on 1"]
    assert followed.returncode == 100, (followed.stdout, followed.stderr)  # SkyPilot's code for a failed job
    assert "FAILED (exit code 5)" in followed.stderr


def test_run_reads_the_bashrc_that_setup_wrote_on_ssh_hosts(home: str, tmp_path: Path, test_hosts,
                                                             wheelhouse, capsys: pytest.CaptureFixture[str]) -> None:
    provider = ssh_provider(test_hosts[:2], wheelhouse)
    seen: list[str] = []

    def on_event(event: ev.Event) -> None:
        if isinstance(event, ev.TaskOutput):
            seen.append(event.line)

    # (Ubuntu's guard: a non-interactive bash returns before setup's line)
    with kept_bashrcs(test_hosts[:2]):
        try:
            path = task(tmp_path, BASHRC, "rc.yaml")
            assert execute(plan(path), provider=provider, console=False, on_event=on_event, cluster={"name": "rc"}) == 0
            # (the run is a job: its lines come as the client follows it, on stdout)
            followed = [x.split("] ", 1)[-1] for x in capsys.readouterr().out.splitlines()]
            assert sorted(x.strip() for x in seen + followed if "FOO is" in x) == ["FOO is bar on 0", "FOO is bar on 1"]
        finally:
            manage.down("rc")
