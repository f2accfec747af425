"""``sky.shell``: commands as pending computations, on Local and SSH pools alike.

Every operator works; output streams as task output; a failure names node, command, exit
code and last lines; and every way of stopping a command (cancel, timeout, a failed
broadcast, Ctrl-C, the pool closing, the worker dying) kills its whole process tree,
including processes that left its session and torchrun's workers. The SSH hosts share this
machine's /tmp and process ids, so the test sees the pids the commands write.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from concurrent.futures import CancelledError
from pathlib import Path

import pytest

import skyward as sky
from skyward import events as ev
from tests.conftest import pid_alive, wait_gone
from tests.contract.conftest import Output
from tests.contract.tasks import node_of


def tree(directory: Path, tag: str) -> str:
    """A command that starts a process tree (a background child, a nohup'd child, and a
    daemon that double-forks into a session of its own), records every pid, says
    ``<tag> started`` and waits."""
    d = directory
    return f"""
        R=$SKYWARD_NODE_RANK
        echo $$ > {d}/n$R-shell.pid
        sleep 300 & echo $! > {d}/n$R-child.pid
        nohup sleep 300 >/dev/null 2>&1 & echo $! > {d}/n$R-nohup.pid
        (setsid sh -c 'sleep 300 & echo $! > {d}/n'$R'-daemon.pid' &)
        while [ ! -s {d}/n$R-daemon.pid ]; do sleep 0.01; done
        echo {tag} started
        wait
    """


def recorded_pids(directory: Path, nodes: tuple[int, ...], timeout: float = 30) -> list[int]:
    """The pids the tree command wrote on ``nodes`` (4 per node), waiting for the files."""
    names = [f"n{n}-{what}.pid" for n in nodes for what in ("shell", "child", "nohup", "daemon")]
    deadline = time.monotonic() + timeout
    while True:
        texts = [(directory / name).read_text().strip() if (directory / name).exists() else "" for name in names]
        if all(texts):
            return [int(t) for t in texts]
        assert time.monotonic() < deadline, f"the command did not record its pids: {texts}"
        time.sleep(0.02)


def assert_no_script_left(directory: Path, timeout: float = 5) -> None:
    """No command script (nor its private folder) is left in ``directory``, the commands' TMPDIR."""
    deadline = time.monotonic() + timeout
    while (left := list(directory.glob("skyward-cmd-*"))) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert left == [], f"command scripts left behind: {left}"


def assert_tree_gone(pids: list[int]) -> None:
    assert pids
    left = wait_gone(pids, 5)
    assert left == [], f"processes still alive after the stop: {left}"


# -- every operator --------------------------------------------------------------------------


def test_broadcast_runs_the_command_on_every_node_and_returns_one_result_per_node(pool: sky.ComputePool) -> None:
    results = sky.shell("echo rank=$SKYWARD_NODE_RANK of $SKYPILOT_NUM_NODES") @ pool
    assert [r.node for r in results] == [0, 1]
    assert all(isinstance(r, sky.CommandResult) and r.returncode == 0 and r.ok for r in results)
    assert [r.output for r in results] == ["rank=0 of 2", "rank=1 of 2"]


def test_rshift_runs_the_command_on_one_node(pool: sky.ComputePool) -> None:
    result = sky.shell("echo one; echo two >&2") >> pool
    assert result.node in (0, 1)
    assert result.output.splitlines() == ["one", "two"]
    assert result.command == "echo one; echo two >&2"


def test_shell_commands_combine_with_python_tasks_in_and_and_gather(pool: sky.ComputePool) -> None:
    result, node = (sky.shell("echo combined") & node_of()) >> pool
    assert result.output == "combined" and node in (0, 1)
    many = sky.gather(*(sky.shell(f"echo {i}") for i in range(4)), node_of()) >> pool
    assert [r.output for r in many[:4]] == ["0", "1", "2", "3"]
    future = sky.shell("echo later") > pool
    assert future.result(timeout=30).output == "later"


def test_output_streams_as_task_output_prefixed_by_node(pool: sky.ComputePool, output: Output, tag: str) -> None:
    sky.shell(f"echo {tag} out $SKYWARD_NODE_RANK; echo {tag} err >&2") @ pool
    assert sorted(output.lines(f"{tag} out")) == [(0, f"{tag} out 0"), (1, f"{tag} out 1")]
    assert sorted(output.lines(f"{tag} err", stream="stderr")) == [(0, f"{tag} err"), (1, f"{tag} err")]


def test_only_head_streams_the_head_nodes_output_and_every_node_keeps_its_tail(pool: sky.ComputePool,
                                                                              output: Output, tag: str) -> None:
    results = sky.shell(f"echo {tag} $SKYWARD_NODE_RANK", only="head") @ pool
    assert output.lines(tag) == [(0, f"{tag} 0")]
    assert [r.output for r in results] == [f"{tag} 0", f"{tag} 1"]
    sky.shell(f"echo {tag}-none", only=None) @ pool
    assert output.lines(f"{tag}-none") == []


def test_env_and_cwd_apply_on_every_node(pool: sky.ComputePool, tmp_path: Path) -> None:
    results = sky.shell('echo "$GREETING from $(pwd)"', env={"GREETING": "hello"}, cwd=tmp_path) @ pool
    assert [r.output for r in results] == [f"hello from {tmp_path}"] * 2


def test_a_missing_cwd_is_a_config_error_naming_it(pool: sky.ComputePool, tmp_path: Path) -> None:
    with pytest.raises(sky.ConfigError) as info:
        sky.shell("true", cwd=tmp_path / "absent") >> pool
    assert info.value.parameter == "cwd" and "absent" in str(info.value)


# -- the environment every node gets --------------------------------------------------------


@sky.compute
def environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith(("SKYWARD_", "SKYPILOT_"))}


def test_every_node_gets_the_launcher_variables_in_shell_commands_and_python_tasks(pool: sky.ComputePool) -> None:
    names = ("NODE_IPS", "NODE_RANK", "NUM_NODES", "NUM_GPUS_PER_NODE", "TASK_ID")
    python = environment() @ pool
    addrs = [i.private_addr for i in pool.instances]
    for node, env in enumerate(python):
        assert env["SKYWARD_NODE_IPS"] == "\n".join(addrs)
        assert env["SKYWARD_HEAD_IP"] == addrs[0]
        assert env["SKYWARD_NODE_RANK"] == str(node)
        assert env["SKYWARD_NUM_NODES"] == "2"
        assert env["SKYWARD_NUM_GPUS_PER_NODE"] == "1"  # CPU nodes: one worker process each
        assert env["SKYWARD_TASK_ID"] == pool.task_id
        assert all(env[f"SKYPILOT_{n}"] == env[f"SKYWARD_{n}"] for n in names)
    dump = ("import json, os; print(json.dumps({k: v for k, v in os.environ.items() "
            "if k.startswith(('SKYWARD_', 'SKYPILOT_'))}))")
    shell = sky.shell(f"{sys.executable} -c \"{dump}\"") @ pool
    assert [json.loads(r.output) for r in shell] == python


# -- failures --------------------------------------------------------------------------------


def test_a_non_zero_exit_raises_command_failed_naming_node_command_code_and_last_lines(pool: sky.ComputePool) -> None:
    command = 'echo "about to fail on $SKYWARD_NODE_RANK"; exit 7'
    with pytest.raises(sky.CommandFailed) as info:
        sky.shell(command) >> pool
    error = info.value
    assert error.exit_code == 7 and error.command == command and error.node in (0, 1)
    assert error.log_tail == [f"about to fail on {error.node}"]
    assert f"on node {error.node}" in str(error) and "exit code 7" in str(error)
    assert "about to fail" in str(error)


def test_check_false_returns_the_exit_code_instead(pool: sky.ComputePool) -> None:
    results = sky.shell("exit $((3 + SKYWARD_NODE_RANK))", check=False) @ pool
    assert [r.returncode for r in results] == [3, 4]


def test_a_command_killed_by_a_signal_says_which(pool: sky.ComputePool) -> None:
    with pytest.raises(sky.CommandFailed) as info:
        sky.shell("echo going; kill -KILL $$") >> pool
    assert info.value.exit_code == -signal.SIGKILL
    assert "killed by SIGKILL" in str(info.value)


def test_a_failing_node_stops_the_other_nodes_commands_promptly(pool: sky.ComputePool, tmp_path: Path,
                                                                tag: str) -> None:
    command = f"""
        if [ "$SKYWARD_NODE_RANK" = 1 ]; then
            while [ ! -s {tmp_path}/n0-daemon.pid ]; do sleep 0.01; done
            echo node 1 gives up; exit 5
        fi
        {tree(tmp_path, tag)}
    """
    started = time.monotonic()
    with pytest.raises(sky.CommandFailed) as info:
        sky.shell(command) @ pool
    assert (info.value.node, info.value.exit_code) == (1, 5)
    assert time.monotonic() - started < 8
    assert_tree_gone(recorded_pids(tmp_path, (0,)))
    assert [r.output for r in sky.shell("echo free") @ pool] == ["free", "free"]


def long_command(directory: Path, count: int) -> str:
    """A command of ``count`` echo lines (17 bytes each) whose output is counted: it says the
    mode of its own file and how many lines it wrote."""
    return ('stat -L -c %a "$0"\n'
            f"exec 3>&1 >{directory}/lines-$SKYWARD_NODE_RANK.txt\n"
            + "".join(f"echo line-{i:06d}\n" for i in range(count))
            + f"exec >&3\nwc -l < {directory}/lines-$SKYWARD_NODE_RANK.txt\n")


def test_a_command_of_1_mib_runs_from_a_private_file_never_left_behind(pool: sky.ComputePool,
                                                                       tmp_path: Path) -> None:
    # 1 MiB of shell code: far past the 128 KiB a single command-line argument may hold.
    count = (1 << 20) // 17 + 1
    command = long_command(tmp_path, count)
    assert len(command) > 1 << 20
    results = sky.shell(command, env={"TMPDIR": str(tmp_path)}) @ pool
    assert [r.output.splitlines() for r in results] == [["600", str(count)]] * 2
    assert_no_script_left(tmp_path)


def test_a_cancelled_command_leaves_no_script_behind(pool: sky.ComputePool, tmp_path: Path, output: Output,
                                                     tag: str) -> None:
    future = sky.shell(f"echo {tag} started; sleep 300", env={"TMPDIR": str(tmp_path)}) > pool
    output.wait_for(f"{tag} started")
    assert future.cancel()
    with pytest.raises(CancelledError):
        future.result(timeout=5)
    assert_no_script_left(tmp_path)


# -- every way of stopping kills the whole tree ------------------------------------------------


def test_cancelling_the_future_kills_the_whole_tree_on_every_node(pool: sky.ComputePool, tmp_path: Path,
                                                                  output: Output, tag: str) -> None:
    futures = [sky.shell(tree(tmp_path, tag)) > pool for _ in range(2)]
    pids = recorded_pids(tmp_path, (0, 1))
    assert all(pid_alive(p) for p in pids)
    for f in futures:
        assert f.cancel()
    for f in futures:
        with pytest.raises(CancelledError):
            f.result(timeout=5)
    assert_tree_gone(pids)
    assert node_of() @ pool == [0, 1]


def test_a_timeout_raises_task_timeout_and_kills_the_tree(pool: sky.ComputePool, tmp_path: Path, tag: str) -> None:
    with pytest.raises(sky.TaskTimeout):
        sky.shell(tree(tmp_path, tag), timeout=3) @ pool
    assert_tree_gone(recorded_pids(tmp_path, (0, 1)))


def test_ctrl_c_kills_the_tree_on_every_node_and_the_pool_stays_usable(pool: sky.ComputePool, tmp_path: Path,
                                                                       tag: str) -> None:
    seen: set[int] = set()

    def interrupt_once_both_started(event: ev.Event) -> None:
        if isinstance(event, ev.TaskOutput) and event.line == f"{tag} started":
            seen.add(event.node)
            if seen == {0, 1}:
                os.kill(os.getpid(), signal.SIGINT)

    unsubscribe = pool.subscribe(interrupt_once_both_started)
    try:
        with pytest.raises(KeyboardInterrupt):
            sky.shell(tree(tmp_path, tag)) @ pool
    finally:
        unsubscribe()
    assert_tree_gone(recorded_pids(tmp_path, (0, 1)))
    assert node_of() @ pool == [0, 1]


def test_what_a_finished_command_left_running_is_stopped_too(pool: sky.ComputePool, tmp_path: Path) -> None:
    results = sky.shell(f"(setsid sleep 300 & echo $! > {tmp_path}/n$SKYWARD_NODE_RANK-left.pid); "
                        "echo done") @ pool
    assert [r.output for r in results] == ["done", "done"]
    pids = [int((tmp_path / f"n{n}-left.pid").read_text()) for n in (0, 1)]
    assert wait_gone(pids, 5) == []


def test_closing_the_pool_kills_running_commands(new_pool, tmp_path: Path, tag: str) -> None:
    with new_pool() as pool:
        futures = [sky.shell(tree(tmp_path, tag)) > pool for _ in range(2)]  # one per node
        pids = recorded_pids(tmp_path, (0, 1))
    for f in futures:
        with pytest.raises((sky.TaskCancelled, sky.ConnectionLost)):
            f.result(timeout=5)
    assert_tree_gone(pids)


def test_a_dead_worker_takes_its_commands_tree_with_it(new_pool, tmp_path: Path, tag: str) -> None:
    with new_pool() as pool:
        futures = [sky.shell(tree(tmp_path, tag), env={"TMPDIR": str(tmp_path)}) > pool for _ in range(2)]
        pids = recorded_pids(tmp_path, (0, 1))
        for pid in pool.worker_pids():
            assert pid is not None
            os.kill(pid, signal.SIGKILL)  # the worker process (the command runs in a session of its own)
        for f in futures:
            with pytest.raises(sky.WorkerLost):
                f.result(timeout=30)
        assert_tree_gone(pids)
        assert_no_script_left(tmp_path)  # removed by the command's guardian, the worker being gone


WORKER_SCRIPT = """
import os, sys, time
name = os.path.join(sys.argv[1], "worker-%s-%s.pid" % (os.environ["SKYWARD_NODE_RANK"], os.environ["LOCAL_RANK"]))
open(name + ".tmp", "w").write(str(os.getpid()))
os.replace(name + ".tmp", name)  # (whole, or not there yet)
time.sleep(300)
"""


def test_stopping_torchrun_kills_torchrun_and_every_worker_it_started(pool: sky.ComputePool, tmp_path: Path) -> None:
    script = tmp_path / "hold.py"
    script.write_text(WORKER_SCRIPT)
    command = (f"echo $$ > {tmp_path}/n$SKYWARD_NODE_RANK-shell.pid; "
               f"exec {sys.executable} -m torch.distributed.run --standalone --nproc_per_node=2 {script} {tmp_path}")
    future = sky.shell(command) > pool
    deadline = time.monotonic() + 90
    while len(list(tmp_path.glob("worker-*.pid"))) < 2:
        assert time.monotonic() < deadline, "torchrun did not start its workers"
        assert not future.done(), future.result()
        time.sleep(0.05)
    workers = [int(p.read_text()) for p in tmp_path.glob("worker-*.pid")]
    launcher = [int(p.read_text()) for p in tmp_path.glob("n*-shell.pid")]
    assert len(workers) == 2 and len(launcher) == 1 and all(pid_alive(p) for p in workers + launcher)
    assert future.cancel()
    assert_tree_gone(workers + launcher)
