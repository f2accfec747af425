"""``skyward launch``: task files are validated before anything starts, flags override them,
``--dryrun`` starts nothing, and the minGPT task file of ``examples/mingpt`` (torchrun with
``--node_rank``, and c10d rendezvous) trains across 2 nodes on a Local pool and on 2 SSH test
hosts."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import skyward as sky
from skyward import events as ev
from skyward.launch import execute, plan
from tests.conftest import free_port, parent_of, skyward_workers
from tests.hosts.conftest_fixture import ssh_provider

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ("train.yaml", "train-rdzv.yaml")


def write(tmp_path: Path, text: str, name: str = "task.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def cli(*args: str, cwd: Path = ROOT, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "skyward.cli", "launch", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


# -- the task file -------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "parameter", "mentions"), [
    ("run: echo\nnum_node: 2\n", "num_node", "num_nodes"),  # a typo: the accepted keys are listed
    ("run: echo\nnum_nodes: two\n", "num_nodes", "an integer >= 1"),
    ("run: echo\nnum_nodes: 0\n", "num_nodes", "an integer >= 1"),
    ("run: echo\nresources: {cpus: lots}\n", "resources.cpus", '"8+"'),
    ("run: echo\nresources: {accelerators: Z80:2}\n", "resources.accelerators", "H100"),
    ("run: echo\nresources: {accelerators: T4:0}\n", "resources.accelerators", "a positive whole number"),
    ("run: echo\nresources: {accelerators: tpu-v2-8}\n", "resources.accelerators", "TPUs"),
    ("run: echo\nresources: {disk: 100}\n", "resources.disk", "use_spot"),
    ("run: echo\nenvs: {9LIVES: x}\n", "envs['9LIVES']", "variable name"),
    ("run: echo\nworkdir: /no/such/dir\n", "workdir", "exists"),
    ("run: echo\nfile_mounts: {/data: ftp://bucket/x}\n", "file_mounts['/data']", "a bucket URL: s3://, gs://"),
    ("runn: echo\n", "runn", "did you mean 'run'"),  # a misspelt key is named as unknown
    ("run: [echo, hi]\n", "run", "a string"),
    ("- run: echo\n", "TASK", "mapping"),
    ("run: 'echo\n", "TASK", "YAML"),
])
def test_a_bad_task_file_is_a_config_error_naming_the_key_and_what_is_accepted(
        tmp_path: Path, text: str, parameter: str, mentions: str) -> None:
    with pytest.raises(sky.ConfigError) as info:
        plan(write(tmp_path, text))
    assert info.value.parameter == parameter
    assert mentions in str(info.value)


def test_a_secrets_value_never_appears_in_errors_plans_or_reprs(tmp_path: Path) -> None:
    with pytest.raises(sky.ConfigError) as info:
        plan(write(tmp_path, "run: echo\nsecrets: {HF_TOKEN: [hunter2]}\n"))
    assert "hunter2" not in str(info.value) and info.value.parameter == "secrets['HF_TOKEN']"
    with pytest.raises(sky.ConfigError) as info:
        plan(write(tmp_path, "run: echo\nsecrets: {A: hunter2}\nnum_nodes: x\n"))
    assert "hunter2" not in str(info.value)
    p = plan(write(tmp_path, "run: echo\nsecrets: {HF_TOKEN: null}\n"), secrets=["HF_TOKEN=hunter2"])
    assert p.secrets == {"HF_TOKEN": "hunter2"}
    assert "hunter2" not in p.describe() and "hunter2" not in repr(p) and "HF_TOKEN=***" in p.describe()


def test_a_variable_left_null_must_be_given_on_the_command_line(tmp_path: Path) -> None:
    task = write(tmp_path, "run: echo\nenvs: {DATA: null, EPOCHS: 3}\nsecrets: {TOKEN: null}\n")
    with pytest.raises(sky.ConfigError) as info:
        plan(task, secrets=["TOKEN=t"])
    assert info.value.parameter == "envs['DATA']" and "--env DATA=" in str(info.value)
    with pytest.raises(sky.ConfigError) as info:
        plan(task, env=["DATA=x"])
    assert info.value.parameter == "secrets['TOKEN']"
    p = plan(task, env=["DATA"], secrets=["TOKEN"], environ={"DATA": "from-env", "TOKEN": "s"})
    assert p.envs == {"DATA": "from-env", "EPOCHS": "3"} and p.secrets == {"TOKEN": "s"}
    with pytest.raises(sky.ConfigError) as info:
        plan(task, env=["DATA"], secrets=["TOKEN=t"], environ={})
    assert info.value.parameter == "--env" and "DATA is not set" in str(info.value)


def test_flags_override_the_file(tmp_path: Path) -> None:
    (tmp_path / "vars.env").write_text("# comment\nEPOCHS=5\nexport MODE='fast'\n")
    task = write(tmp_path, """
        name: t
        num_nodes: 4
        resources: {accelerators: L4:2, cpus: 8+}
        envs: {EPOCHS: 1, MODE: slow, KEEP: yes-kept}
        run: echo
    """)
    p = plan(task, num_nodes=2, gpus="A100:8", cpus="16", env_file=tmp_path / "vars.env", env=["MODE=exact"])
    assert (p.nodes, p.accelerator, p.cpus) == (2, "A100:8", "16")
    assert p.envs == {"EPOCHS": "5", "MODE": "exact", "KEEP": "yes-kept"}
    with pytest.raises(sky.ConfigError) as info:
        plan(task, gpus="L4:zero")
    assert info.value.parameter == "--gpus"
    with pytest.raises(sky.ConfigError) as info:
        plan(task, provider="gcp")
    assert info.value.parameter == "--provider" and "local, ssh, aws" in str(info.value)
    with pytest.raises(sky.ConfigError) as info:
        plan(task, provider="ssh")
    assert info.value.parameter == "--hosts"
    with pytest.raises(sky.ConfigError) as info:
        plan(task, provider="ssh", hosts=["a", "b"])
    assert info.value.parameter == "--num-nodes"


def test_dryrun_prints_the_plan_and_starts_nothing(tmp_path: Path) -> None:
    done = cli(str(ROOT / "examples/mingpt/train.yaml"), "--dryrun", "--num-nodes", "3", "--env", "MINGPT_STEPS=2")
    assert done.returncode == 0, done.stderr
    assert "task 'mingpt-torchrun': 3 node(s) on local" in done.stdout
    assert "env MINGPT_STEPS=2" in done.stdout and "--node_rank=${SKYPILOT_NODE_RANK}" in done.stdout
    assert "dry run: nothing was started" in done.stdout
    assert "starting" not in done.stderr and "ready" not in done.stderr  # no pool's stages
    # Hosts nobody can reach (TEST-NET-1): a plan that connected would fail or hang.
    started = time.monotonic()
    done = cli(str(ROOT / "examples/mingpt/train.yaml"), "--dryrun", "--provider", "ssh",
               "--hosts", "me@192.0.2.55,me@192.0.2.56", timeout=60)
    assert done.returncode == 0, done.stderr
    assert "me@192.0.2.55, me@192.0.2.56" in done.stdout and time.monotonic() - started < 20


def test_dryrun_on_aws_shows_the_instance_type_and_its_price_without_calling_aws(tmp_path: Path) -> None:
    done = cli(str(ROOT / "examples/mingpt/train.yaml"), "--dryrun", "--provider", "aws", "--gpus", "L4:4",
               "--cpus", "8+", "--num-nodes", "4", "--secret", "TOKEN=zzz-secret")
    assert done.returncode == 0, done.stderr
    assert "4 x g6.12xlarge" in done.stdout and "/h" in done.stdout
    assert "zzz-secret" not in done.stdout + done.stderr


def test_the_cli_reports_a_bad_task_file_with_exit_status_2(tmp_path: Path) -> None:
    done = cli(str(write(tmp_path, "run: echo\nnodes: 2\n")))
    assert done.returncode == 2
    assert "nodes" in done.stderr and "num_nodes" in done.stderr


# -- running -----------------------------------------------------------------------------------


def test_the_exit_status_is_the_failing_nodes_and_names_it(tmp_path: Path) -> None:
    # Node 1 fails only once node 0 has said its line (a file both nodes see: Local), so the
    # test waits on that event, not on which worker the machine runs first; what node 0 said
    # before the failure must still be printed.
    said = tmp_path / "node0-said"
    task = write(tmp_path, f"""
        num_nodes: 2
        run: |
          echo "node $SKYPILOT_NODE_RANK here"
          if [ "$SKYPILOT_NODE_RANK" = 0 ]; then touch {said}; sleep 60; fi
          while [ ! -e {said} ]; do sleep 0.01; done
          exit 3
    """)
    started = time.monotonic()
    done = cli(str(task), cwd=tmp_path)
    assert done.returncode == 3, done.stderr
    assert "run failed on node 1" in done.stderr and "exit code 3" in done.stderr
    assert "[node 0] node 0 here" in done.stdout and "[node 1] node 1 here" in done.stdout
    assert time.monotonic() - started < 60  # node 0's sleep was stopped, not waited for


def test_a_run_block_of_200000_lines_runs_and_leaves_no_script_behind(tmp_path: Path) -> None:
    # As SkyPilot's long-script smoke test: far past the 128 KiB one command-line argument may hold.
    lines = 200_000
    task = tmp_path / "long.yaml"
    task.write_text("run: |\n" + "".join(f"  echo {i}\n" for i in range(lines)))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path), "SKYWARD_CONSOLE": "plain"}
    done = subprocess.run([sys.executable, "-m", "skyward.cli", "launch", str(task)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    printed = [line for line in done.stdout.splitlines() if line.startswith("[node 0] ")]
    assert printed == [f"[node 0] {i}" for i in range(lines)]
    assert list(tmp_path.glob("skyward-cmd-*")) == []


def test_a_line_of_1_mib_reaches_the_clients_stdout_whole(tmp_path: Path) -> None:
    task = write(tmp_path, """
        run: |
          python3 -c "print('y' * (1 << 20))"
          echo after
    """)
    done = cli(str(task), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    printed = [line for line in done.stdout.splitlines() if line.startswith("[node 0] ")]
    assert [len(line) for line in printed] == [len("[node 0] ") + (1 << 20), len("[node 0] after")]
    assert printed[0] == "[node 0] " + "y" * (1 << 20)


PROGRESS_TASK = """
    run: |
      printf 'frame-1\\rframe-2\\rframe-3\\n'
      echo after
"""


def under_a_terminal(args: list[str], cwd: Path, timeout: float = 120) -> tuple[int, bytes]:
    """Run ``args`` with a pseudo-terminal as its stdin, stdout and stderr (as a user's shell
    does); returns its exit status and everything it wrote to the terminal."""
    import pty
    import select

    master, slave = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TERM": "xterm-256color", "COLUMNS": "200"}
    env.pop("SKYWARD_CONSOLE", None)
    proc = subprocess.Popen(args, cwd=cwd, env=env, stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    seen = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    data = os.read(master, 1 << 16)
                except OSError:  # EIO: the terminal's last writer is gone
                    break
                if not data:
                    break
                seen += data
            elif proc.poll() is not None:
                break
        return proc.wait(timeout=max(1.0, deadline - time.monotonic())), bytes(seen)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)


def test_every_carriage_return_frame_reaches_a_terminal(tmp_path: Path) -> None:
    task = write(tmp_path, PROGRESS_TASK)
    code, seen = under_a_terminal([sys.executable, "-m", "skyward.cli", "launch", str(task)], tmp_path)
    assert code == 0, seen[-2000:]
    seen = re.sub(rb"\x1b\[[0-9;?]*[A-Za-z]", b"", seen)  # (the live view's colours and cursor moves)
    # Each frame with the node's prefix, as the task drew them: the terminal redraws the line.
    assert b"[node 0] frame-1\r[node 0] frame-2\r[node 0] frame-3" in seen, seen[-2000:]
    assert b"[node 0] after" in seen


def test_off_a_terminal_a_redrawn_line_shows_its_last_frame(tmp_path: Path) -> None:
    done = cli(str(write(tmp_path, PROGRESS_TASK)), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    printed = [line for line in done.stdout.split("\n") if line.startswith("[node 0] ")]
    assert printed == ["[node 0] frame-3", "[node 0] after"]


FILES_TASK = """
    num_nodes: 2
    workdir: {workdir}
    file_mounts:
      {mount}: {source}
    envs: {{GREETING: hello}}
    secrets: {{TOKEN: null}}
    setup: |
      echo "setup on $SKYPILOT_NODE_RANK in $(basename $(pwd))" > setup-$SKYPILOT_NODE_RANK.txt
    run: |
      cat data.txt
      cat setup-$SKYPILOT_NODE_RANK.txt
      cat {mount}
      echo "$GREETING, token of ${{#TOKEN}} chars"
"""


def launch_files_task(tmp_path: Path, provider: sky.SSH | None) -> tuple[int, list[tuple[int, str]], str]:
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "data.txt").write_text("from the workdir\n")
    (tmp_path / "mounted.txt").write_text("from a file mount\n")
    mount = tmp_path / "on-node" / "mounted.txt"
    task = write(tmp_path, FILES_TASK.format(workdir=workdir, mount=mount, source=tmp_path / "mounted.txt"))
    lines: list[tuple[int, str]] = []

    def on_event(event: ev.Event) -> None:
        if isinstance(event, ev.TaskOutput):
            lines.append((event.node, event.line))

    from io import StringIO

    err = StringIO()
    code = execute(plan(task, secrets=["TOKEN=abcd"]), provider=provider, console=False, on_event=on_event, err=err)
    return code, lines, err.getvalue()


def expected_files_output(node: int, workdir_name: str) -> list[tuple[int, str]]:
    return [(node, "from the workdir"), (node, f"setup on {node} in {workdir_name}"),
            (node, "from a file mount"), (node, "hello, token of 4 chars")]


def test_workdir_file_mounts_setup_envs_and_secrets_on_a_local_pool(tmp_path: Path) -> None:
    code, lines, err = launch_files_task(tmp_path, None)
    assert code == 0, err
    for node in (0, 1):
        assert [item for item in lines if item[0] == node] == expected_files_output(node, "work")


def test_workdir_file_mounts_setup_envs_and_secrets_on_ssh_hosts(tmp_path: Path, test_hosts, wheelhouse) -> None:
    code, lines, err = launch_files_task(tmp_path, ssh_provider(test_hosts[:2], wheelhouse))
    assert code == 0, err
    for node in (0, 1):
        mine = [item for item in lines if item[0] == node]
        assert mine[0] == (node, "from the workdir") and mine[2:] == expected_files_output(node, "")[2:]
        assert mine[1][1].startswith(f"setup on {node} in skyward-")  # ~/.skyward/workdirs/<task id>


def check_training(text: str) -> None:
    assert "mingpt: world of 2 rank(s) on 2 node(s); all_reduce saw ranks [0, 1]" in text, text[-3000:]
    assert "mingpt: done: 40 steps across 2 rank(s)" in text and "weights identical on every rank" in text


@pytest.mark.parametrize("example", EXAMPLES)
def test_the_mingpt_example_trains_across_two_nodes_of_a_local_pool(example: str) -> None:
    # a free port: other test files may run the same example on this machine at the same time
    done = cli(f"examples/mingpt/{example}", "--env", f"MINGPT_PORT={free_port()}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    check_training(done.stdout)
    if example == "train.yaml":  # --node_rank: rank 0 is node 0 (c10d may give it to either node)
        assert "[node 0] mingpt: done" in done.stdout


@pytest.mark.parametrize("example", EXAMPLES)
def test_the_mingpt_example_trains_across_two_ssh_hosts(example: str, test_hosts, wheelhouse,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the task's workdir is "." (the repository), as in SkyPilot's minGPT recipe
    lines: list[str] = []

    def on_event(event: ev.Event) -> None:
        if isinstance(event, ev.TaskOutput):
            lines.append(f"[node {event.node}] {event.line}")

    from io import StringIO

    err = StringIO()
    provider = ssh_provider(test_hosts[:2], wheelhouse)
    code = execute(plan(f"examples/mingpt/{example}"), provider=provider, console=False, on_event=on_event, err=err)
    text = "\n".join(lines)
    # (where training got, and the first errors: the tail alone is torchrun's teardown)
    said = "\n".join(line for line in lines if "mingpt:" in line or "rror" in line or "terminate" in line)
    assert code == 0, said[:3000] + "\n...\n" + text[-3000:] + err.getvalue()
    check_training(text)


def test_ctrl_c_tears_everything_down_with_exit_status_130(tmp_path: Path) -> None:
    from tests.conftest import wait_gone

    task = write(tmp_path, f"""
        num_nodes: 2
        run: |
          sleep 300 & echo $! > {tmp_path}/n$SKYPILOT_NODE_RANK.pid
          (setsid sleep 300 & echo $! > {tmp_path}/d$SKYPILOT_NODE_RANK.pid)
          echo started
          wait
    """)
    proc = subprocess.Popen([sys.executable, "-m", "skyward.cli", "launch", str(task)], cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    names = [f"{k}{n}.pid" for k in "nd" for n in (0, 1)]
    deadline = time.monotonic() + 60
    while not all((tmp_path / n).exists() and (tmp_path / n).read_text().strip() for n in names):
        assert time.monotonic() < deadline and proc.poll() is None, "the task did not start"
        time.sleep(0.05)
    pids = [int((tmp_path / n).read_text()) for n in names]

    def descends_from_launch(pid: int) -> bool:
        while pid > 1 and pid != proc.pid:
            pid = parent_of(pid)
        return pid == proc.pid

    # This launch's Local workers: forked by its worker template (which is one of them too,
    # "skyward.worker.template"), or its own children where workers are not forked.
    workers = [w for w in skyward_workers() if descends_from_launch(w)]
    first = [w for w in workers if parent_of(w) == proc.pid]
    second = [w for w in workers if parent_of(w) in first]  # (forked workers; or the workers' own forks)
    nodes = second if len(first) == 1 and second else first
    assert len(nodes) == 2, workers
    proc.send_signal(2)  # SIGINT, as Ctrl-C sends it
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert wait_gone(pids + workers, 5) == []


def test_the_plan_configures_the_provider_it_names(tmp_path: Path) -> None:
    from skyward.launch import make_provider

    task = write(tmp_path, """
        num_nodes: 2
        resources: {cpus: 8+, memory: 32+, use_spot: true, region: eu-west-1}
        run: echo
    """)
    aws = make_provider(plan(task, provider="aws"))
    assert isinstance(aws, sky.AWS)
    assert (aws.region, aws.vcpus, aws.memory_gb, aws.allocation) == ("eu-west-1", 8, 32, "spot")
    typed = make_provider(plan(write(tmp_path, "run: echo\nresources: {instance_type: g6.xlarge}\n", "t.yaml"),
                               provider="aws"))
    assert (typed.instance_type, typed.allocation) == ("g6.xlarge", "on-demand")
    ssh = make_provider(plan(task, provider="ssh", hosts=["me@10.1.2.3", "me@10.1.2.4", "me@10.1.2.5"]))
    assert isinstance(ssh, sky.SSH) and len(ssh.hosts) == 2  # as many hosts as nodes
    assert isinstance(make_provider(plan(task)), sky.Local)

