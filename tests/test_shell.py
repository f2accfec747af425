"""``sky.shell`` outside a pool: bad input is refused naming the parameter, a command runs
here with ``.local()``, its errors pickle, and the guardian stops the whole tree when the
caller is interrupted (the contract suite covers pools: tests/contract/test_shell.py).

One internal on purpose: ``skyward.runtime.instance.node_environment``, for node shapes (GPUs per
node, peers on other hosts) that a Local pool on this machine cannot make."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import skyward as sky
from tests.conftest import pid_alive, wait_gone

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("kwargs", "parameter"), [
    ({"command": ""}, "command"),
    ({"command": "   "}, "command"),
    ({"command": ["ls", "-l"]}, "command"),
    ({"env": ["A=1"]}, "env"),
    ({"env": {"A": 1}}, "env['A']"),
    ({"env": {"A=B": "1"}}, "env"),
    ({"cwd": 3}, "cwd"),
    ({"check": "yes"}, "check"),
    ({"timeout": 0}, "timeout"),
    ({"timeout": -1.0}, "timeout"),
    ({"timeout": float("inf")}, "timeout"),
    ({"timeout": True}, "timeout"),
    ({"only": "tail"}, "only"),
])
def test_bad_input_is_a_config_error_naming_the_parameter(kwargs: dict, parameter: str) -> None:
    kwargs = {"command": "true", **kwargs}
    with pytest.raises(sky.ConfigError) as info:
        sky.shell(kwargs.pop("command"), **kwargs)
    assert info.value.parameter == parameter


def test_a_secret_looking_env_value_is_not_shown_in_the_error() -> None:
    with pytest.raises(sky.ConfigError) as info:
        sky.shell("true", env={"API_TOKEN": b"hunter2"})  # type: ignore[dict-item]
    assert "hunter2" not in str(info.value)


def test_shell_is_a_picklable_pending_compute_with_the_command_in_its_name() -> None:
    pending = sky.shell("torchrun main.py", timeout=5)
    assert isinstance(pending, sky.PendingCompute)
    assert pending.name == "shell: torchrun main.py" and pending.options.timeout == 5.0
    again = pickle.loads(pickle.dumps(pending))
    assert again.args == pending.args


def test_local_runs_the_command_here() -> None:
    result = sky.shell("echo $GREETING; exit 0", env={"GREETING": "hi"}).local()
    assert (result.node, result.returncode, result.output) == (0, 0, "hi")
    assert sky.shell("exit 4", check=False).local().returncode == 4
    with pytest.raises(sky.CommandFailed) as info:
        sky.shell("echo bad >&2; exit 4").local()
    assert (info.value.exit_code, info.value.log_tail, info.value.node) == (4, ["bad"], 0)


def test_a_line_without_a_final_newline_and_long_output_are_kept() -> None:
    result = sky.shell("seq 1 1000; printf tail-without-newline").local()
    lines = result.output.splitlines()
    assert len(lines) == 50 and lines[-2:] == ["1000", "tail-without-newline"]


def test_a_command_of_1_mib_runs_here_and_leaves_no_script_behind(tmp_path: Path) -> None:
    count = (1 << 20) // 10  # lines of "echo NNNN" (10 bytes), over 1 MiB: past what one argument may hold
    command = ('stat -L -c %a "$0"\n' f"exec 3>&1 >{tmp_path}/lines\n"
               + "".join(f"echo {i:04d}\n" for i in range(count)) + f"exec >&3\nwc -l < {tmp_path}/lines")
    assert len(command) > 1 << 20
    result = sky.shell(command, env={"TMPDIR": str(tmp_path)}).local()
    assert result.output.splitlines() == ["600", str(count)]  # (its code: in a file only its user reads)
    assert [p.name for p in tmp_path.iterdir()] == ["lines"]


def test_command_failed_pickles_with_its_fields() -> None:
    error = sky.CommandFailed("exit 9", 1, -9, ["a", "b"])
    again = pickle.loads(pickle.dumps(error))
    assert (again.command, again.node, again.exit_code, again.log_tail) == ("exit 9", 1, -9, ["a", "b"])
    assert "killed by SIGKILL" in str(again) and "node 1" in str(again)


INTERRUPTED = """
import skyward as sky, sys
d = sys.argv[1]
sky.shell(f'''
    echo $$ > {d}/shell.pid
    sleep 300 & echo $! > {d}/child.pid
    (setsid sh -c 'sleep 300 & echo $! > {d}/daemon.pid' &)
    while [ ! -s {d}/daemon.pid ]; do sleep 0.01; done
    echo started
    wait
''').local()
"""


def test_ctrl_c_during_local_kills_the_whole_tree_including_a_daemon_in_its_own_session(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", INTERRUPTED, str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "started"
    pids = [int((tmp_path / f"{n}.pid").read_text()) for n in ("shell", "child", "daemon")]
    assert all(pid_alive(p) for p in pids)
    daemon_session = os.getsid(pids[2])
    assert daemon_session not in (os.getsid(pids[0]), os.getsid(proc.pid))  # it really left
    started = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert "KeyboardInterrupt" in err
    assert wait_gone(pids, 5) == []
    assert time.monotonic() - started < 10


def test_node_environment_counts_gpus_or_worker_processes_and_aliases_every_name() -> None:
    from skyward.runtime.instance import InstanceInfo, Peer, node_environment

    peers = (Peer(0, "10.0.0.1"), Peer(1, "10.0.0.2"), Peer(2, "10.0.0.3"))
    gpu = node_environment(InstanceInfo(node=2, total_nodes=3, head_addr="10.0.0.1", accelerators=4,
                                        peers=peers), "run-1")
    assert gpu["SKYWARD_NODE_IPS"] == "10.0.0.1\n10.0.0.2\n10.0.0.3"
    assert (gpu["SKYWARD_NODE_RANK"], gpu["SKYWARD_NUM_NODES"], gpu["SKYWARD_NUM_GPUS_PER_NODE"]) == ("2", "3", "4")
    assert (gpu["SKYWARD_HEAD_IP"], gpu["SKYWARD_TASK_ID"]) == ("10.0.0.1", "run-1")
    for name in ("NODE_IPS", "NODE_RANK", "NUM_NODES", "NUM_GPUS_PER_NODE", "TASK_ID"):
        assert gpu[f"SKYPILOT_{name}"] == gpu[f"SKYWARD_{name}"]
    cpu = node_environment(InstanceInfo(node=0, total_nodes=3, peers=peers, processes_per_node=2), "run-1")
    assert cpu["SKYWARD_NUM_GPUS_PER_NODE"] == "2"


def test_a_cancelled_command_on_the_process_executor_loses_its_whole_tree(tmp_path: Path) -> None:
    command = f"""
        sleep 300 & echo $! > {tmp_path}/child.pid
        (setsid sleep 300 & echo $! > {tmp_path}/daemon.pid)
        echo $$ > {tmp_path}/shell.pid
        wait
    """
    with sky.ComputePool(nodes=1, executor="process", console=False) as pool:
        future = sky.shell(command) > pool
        deadline = time.monotonic() + 60
        names = ("child", "daemon", "shell")
        while not all((tmp_path / f"{n}.pid").exists() and (tmp_path / f"{n}.pid").read_text().strip()
                      for n in names):
            assert time.monotonic() < deadline and not future.done()
            time.sleep(0.02)
        pids = [int((tmp_path / f"{n}.pid").read_text()) for n in names]
        assert all(pid_alive(p) for p in pids)
        assert future.cancel()
        assert wait_gone(pids, 5) == []
        assert (sky.shell("echo still usable") >> pool).output == "still usable"


def guarded_by_a_counting_guardian(command: str, tmp_path: Path) -> tuple[str, int]:
    """Run ``command`` under the command guardian as the worker starts it (``python -I -S
    runtime/_reaper.py PROCS GRACE SHELL SCRIPT_FD STATUS_FD``), its /proc reader counting the
    scans of every process it makes: (the guardian's status line, the number of scans)."""
    scans = tmp_path / "scans"
    procs = tmp_path / "procs.py"  # skyward's reader, each scan noted in a file
    procs.write_text(f"exec(compile(open({str(ROOT / 'skyward' / '_procs.py')!r}).read(), 'procs', 'exec'))\n"
                     "whole = scan\n"
                     f"def scan():\n    open({str(scans)!r}, 'a').write('.')\n    return whole()\n")
    script = tmp_path / "command.sh"
    script.write_text(command)
    fd = os.open(script, os.O_RDONLY)
    status_r, status_w = os.pipe()
    try:
        guardian = subprocess.Popen([sys.executable, "-I", "-S", str(ROOT / "skyward" / "runtime" / "_reaper.py"),
                                     str(procs), "0.5", "/bin/bash", str(fd), str(status_w)],
                                    stdin=subprocess.PIPE, pass_fds=(fd, status_w))
        os.close(status_w)
        with os.fdopen(status_r) as status:
            line = status.readline().strip()
        assert guardian.wait(30) == 0
        guardian.stdin.close()  # (the control pipe the worker would hold: closed only after the end)
    finally:
        os.close(fd)
    return line, len(scans.read_text()) if scans.exists() else 0


def test_a_command_that_left_nothing_running_ends_without_a_scan_of_every_process(tmp_path: Path) -> None:
    # Each scan reads every process's /proc stat: with a few hundred processes on the machine,
    # the guardian of `skyward exec NAME true` spent ~40 ms of CPU scanning before it reported.
    assert guarded_by_a_counting_guardian("exit 3\n", tmp_path) == ("3 0 0", 0)
    # What a command leaves running is still found and stopped.
    pid_file = tmp_path / "left.pid"
    line, scans = guarded_by_a_counting_guardian(f"sleep 300 & echo $! > {pid_file}\n", tmp_path)
    assert line == "0 0 0" and scans > 0
    assert wait_gone([int(pid_file.read_text())], 10) == []
