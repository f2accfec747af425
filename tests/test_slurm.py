"""sky.Slurm on a real Slurm cluster (tests/slurm_cluster.py): the controller on this machine,
the two compute nodes in the network namespaces of this session's SSH test hosts.

After every test Slurm runs no job of ours and no worker is left on any node."""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import skyward as sky
from skyward import events as ev
from tests import slurm_cluster
from tests.conftest import free_port, interactive_signals

pytestmark = slurm_cluster.needs_slurm
slurm, nothing_left = slurm_cluster.slurm, slurm_cluster.nothing_left  # (the shared fixtures)


@sky.compute
def where() -> tuple[str, str | None, int]:
    import os
    import socket

    return socket.gethostname(), os.environ.get("SLURMD_NODENAME"), sky.instance_info().node


def test_a_two_node_pool_runs_a_broadcast_on_each_node(slurm) -> None:
    with sky.ComputePool(provider=sky.Slurm(), nodes=2, console=False) as pool:
        assert where() @ pool == [(slurm.nodes[0], slurm.nodes[0], 0), (slurm.nodes[1], slurm.nodes[1], 1)]
        assert slurm.jobs()[0].split()[1:] == [f"skyward-{pool.id}", "RUNNING"]


def test_processes_per_node_start_that_many_workers_on_each_node(slurm) -> None:
    @sky.compute
    def rank() -> tuple[str | None, int, int, str]:
        import os

        info = sky.instance_info()
        return os.environ.get("SLURMD_NODENAME"), info.node, info.local_rank, os.environ["SLURM_STEP_ID"]

    with sky.ComputePool(provider=sky.Slurm(), nodes=2, processes_per_node=2, console=False) as pool:
        ranks = sorted(rank() @ pool)
        assert [r[:3] for r in ranks] == [(slurm.nodes[0], 0, 0), (slurm.nodes[0], 0, 1),
                                          (slurm.nodes[1], 1, 0), (slurm.nodes[1], 1, 1)]
        assert len({r[3] for r in ranks}) == 4  # a job step each


def test_torch_ddp_allreduces_across_the_allocation(slurm) -> None:
    pytest.importorskip("torch")

    @sky.compute
    def world() -> tuple[int, int, float, str]:
        import os

        import torch
        import torch.distributed as dist

        t = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(t)
        return dist.get_rank(), dist.get_world_size(), float(t.item()), os.environ["MASTER_ADDR"]

    plugins = [sky.plugins.torch(backend="gloo", timeout=30)]
    with sky.ComputePool(provider=sky.Slurm(), nodes=2, plugins=plugins, console=False, start_timeout=60) as pool:
        head = slurm.addrs[slurm.nodes[0]]
        assert world() @ pool == [(0, 2, 3.0, head), (1, 2, 3.0, head)]


@sky.compute
def nap(seconds: float) -> None:
    import time

    time.sleep(seconds)


def _job(slurm, pool) -> str:
    return next(line.split()[0] for line in slurm.jobs() if line.split()[1] == f"skyward-{pool.id}")


def test_an_allocation_that_reaches_its_time_limit_raises_slurm_time_limit(slurm) -> None:
    # Slurm's smallest limit is a minute: the test lowers the running job's limit to zero, and
    # Slurm ends the job by its own time-limit check (state TIMEOUT), as at the end of a real one.
    with sky.ComputePool(provider=sky.Slurm(time="10:00"), nodes=2, console=False) as pool:
        job = _job(slurm, pool)
        napping = nap(300) > pool
        assert slurm.run("scontrol", "update", f"JobId={job}", "TimeLimit=0").returncode == 0
        with pytest.raises(sky.SlurmTimeLimit) as caught:
            napping.result(timeout=90)
        assert caught.value.job == job and caught.value.limit == "00:00:00"
        assert "time limit" in str(caught.value) and "sky.Slurm(time=" in str(caught.value)
        with pytest.raises(sky.SlurmTimeLimit):
            where() @ pool


def test_a_failed_node_is_named_and_replace_lost_brings_nodes_back_in_new_allocations(slurm) -> None:
    failed = slurm.nodes[1]
    with sky.ComputePool(provider=sky.Slurm(), nodes=2, replace_lost=True, console=False, start_timeout=60) as pool:
        first = _job(slurm, pool)
        napping = nap(300) > pool
        try:
            # A node's slurmd dies; slurmctld would mark the node DOWN after SlurmdTimeout (and the
            # job NODE_FAIL): the test says so at once.
            slurm.kill_slurmd(failed)
            assert slurm.run("scontrol", "update", f"NodeName={failed}", "State=DOWN",
                             "Reason=slurmd-killed").returncode == 0
            with pytest.raises(sky.WorkerLost) as caught:
                napping.result(timeout=60)
            assert f"Slurm job {first} is NODE_FAIL" in str(caught.value)
            assert f"{failed} is DOWN" in str(caught.value) and "slurmd-killed" in str(caught.value)
            pool.wait_ready(timeout=60)
            assert where() @ pool == [(slurm.nodes[0], slurm.nodes[0], 0), (slurm.nodes[0], slurm.nodes[0], 1)]
            jobs = [line.split() for line in slurm.jobs()]
            assert len(jobs) == 2 and first not in {j[0] for j in jobs}
            assert {j[1] for j in jobs} == {f"skyward-{pool.id}"}
        finally:
            slurm.start_slurmd(failed)  # (it registers; Slurm returns the node to service)
    slurm.wait_idle()


def test_an_unknown_partition_is_refused_naming_it_and_the_partitions(slurm) -> None:
    with pytest.raises(sky.ConfigError) as caught:
        with sky.ComputePool(provider=sky.Slurm(partition="nope"), nodes=1, console=False):
            pass
    assert caught.value.parameter == "partition" and caught.value.got == "nope"
    assert slurm.partition in caught.value.accepted
    assert "Slurm said" in str(caught.value)


def test_more_nodes_than_the_partition_has_is_refused(slurm) -> None:
    with pytest.raises(sky.ConfigError) as caught:
        with sky.ComputePool(provider=sky.Slurm(), nodes=3, console=False):
            pass
    assert caught.value.parameter == "nodes" and caught.value.got == 3
    assert "at most 2" in caught.value.accepted


def test_a_queued_allocation_says_why_and_is_cancelled_at_start_timeout(slurm) -> None:
    blocker = slurm.run("salloc", "--no-shell", "--exclusive", f"--nodes={len(slurm.nodes)}", "--job-name=blocker")
    assert blocker.returncode == 0, blocker.stderr
    seen: list[str] = []

    def on_event(event) -> None:
        if isinstance(event, ev.NodeStage) and event.stage == "provisioning" and event.detail:
            seen.append(event.detail)

    try:
        with pytest.raises(sky.CapacityError, match="start_timeout=3s"):
            with sky.ComputePool(provider=sky.Slurm(), nodes=2, console=False, start_timeout=3, on_event=on_event):
                pass
        assert seen and "Resources" in seen[0] and "1st in the queue" in seen[0]
        assert [line.split()[1] for line in slurm.jobs()] == ["blocker"]
    finally:
        slurm.run("scancel", "--name=blocker")


CLIENT = """
import skyward as sky

with sky.ComputePool(provider=sky.Slurm(), nodes=2, start_timeout=300):
    pass
"""


def test_ctrl_c_while_the_allocation_is_queued_cancels_it(slurm, tmp_path) -> None:
    blocker = slurm.run("salloc", "--no-shell", "--exclusive", f"--nodes={len(slurm.nodes)}", "--job-name=blocker")
    assert blocker.returncode == 0, blocker.stderr
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    env = {**slurm.env, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    client = subprocess.Popen([sys.executable, str(script)], env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        seen = []
        for line in client.stderr:  # the console's line for the queued request: Slurm's reason
            seen.append(line)
            if "queued in Slurm as job" in line:
                break
        assert "Resources" in seen[-1], seen
        assert any(line.split()[1].startswith("skyward-") for line in slurm.jobs())
        client.send_signal(signal.SIGINT)
        rest = client.stderr.read()
        assert client.wait(60) != 0
        assert "interrupted" in rest and "nothing left running" in rest, rest
        assert [line.split()[1] for line in slurm.jobs()] == ["blocker"]  # (nothing left to wait on)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
        slurm.run("scancel", "--name=blocker")


#: salloc as Slurm ships it, except that it keeps its answer to itself, as a salloc --no-shell
#: interrupted while its request was in flight does (it takes the grant, exits 0 and says
#: nothing), and lingers: it says ``granted`` on a FIFO, then waits for a line on another.
SILENT_SALLOC = """#!/bin/sh
exec 3<>{go}
{salloc} "$@" 2>/dev/null
echo granted > {fifo}
read line <&3
"""


def test_ctrl_c_on_a_granted_request_that_never_said_its_job_id_leaves_no_allocation(slurm, tmp_path) -> None:
    bin_dir, fifo, go = tmp_path / "bin", tmp_path / "granted", tmp_path / "go"
    bin_dir.mkdir()
    os.mkfifo(fifo)
    os.mkfifo(go)
    (bin_dir / "salloc").write_text(SILENT_SALLOC.format(salloc=shutil.which("salloc"), fifo=fifo, go=go))
    (bin_dir / "salloc").chmod(0o755)
    (tmp_path / "client.py").write_text(CLIENT)
    env = {**slurm.env, "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # (open first: the salloc's echo does not block)
    client = subprocess.Popen([sys.executable, str(tmp_path / "client.py")], env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              preexec_fn=interactive_signals)
    try:
        assert select.select([reader], [], [], 60)[0], "salloc never said it was granted"
        assert os.read(reader, 100).decode().split() == ["granted"]
        assert [line.split()[2] for line in slurm.jobs()] == ["RUNNING"]  # (granted: the window is open)
        client.send_signal(signal.SIGINT)
        said = slurm_cluster.lines_until(client.stderr, "waiting for Slurm's answer to salloc")
        with contextlib.suppress(OSError):  # (the client waits for salloc's end; ENXIO: salloc is gone)
            writer = os.open(go, os.O_WRONLY | os.O_NONBLOCK)
            os.write(writer, b"go\n")
            os.close(writer)
        rest = said + client.stderr.read()
        assert client.wait(60) != 0, rest
        assert slurm.jobs() == [], rest  # found by its name and cancelled before the client exited
    finally:
        os.close(reader)
        if client.poll() is None:
            client.kill()
            client.wait()


def test_ctrl_c_while_slurm_handles_the_request_leaves_no_job_after_the_client(slurm, tmp_path) -> None:
    # Every node busy: salloc --immediate is refused, and sbatch's request is held in the
    # controller (sent, its job not made yet) while a real Ctrl-C reaches the client's process
    # group, as a terminal sends it. The job Slurm makes once it goes on must not outlive the client.
    blocker = slurm.run("salloc", "--no-shell", "--exclusive", f"--nodes={len(slurm.nodes)}", "--job-name=blocker")
    assert blocker.returncode == 0, blocker.stderr
    (tmp_path / "client.py").write_text(CLIENT)
    env = {**slurm.env, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    client = None
    try:
        with slurm.gate("batch") as gate:
            client = subprocess.Popen([sys.executable, str(tmp_path / "client.py")], env=env,
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True, preexec_fn=interactive_signals, start_new_session=True)
            assert gate.wait_held().startswith("skyward-")
            os.killpg(client.pid, signal.SIGINT)
            said = slurm_cluster.lines_until(client.stderr, "waiting for Slurm's answer to sbatch")
            gate.release()  # (the client waits on it, or has already gone)
        rest = said + client.stderr.read()
        assert client.wait(60) != 0, rest
        assert "nothing left running" in rest, rest
        assert [line.split()[1] for line in slurm.jobs()] == ["blocker"], rest
        assert "interrupted: waiting for Slurm's answer to sbatch" in said, rest  # (the console says why)
    finally:
        if client is not None and client.poll() is None:
            client.kill()
            client.wait()
        slurm.run("scancel", "--name=blocker")


TASK = """\
name: ranks
num_nodes: 2
resources:
  infra: slurm/{partition}
run: |
  echo "rank $SKYPILOT_NODE_RANK of $SKYPILOT_NUM_NODES on $SLURMD_NODENAME"
"""


@pytest.mark.parametrize("how", ["infra", "flag"])
def test_a_two_node_task_file_runs_on_slurm(slurm, tmp_path, how) -> None:
    task = tmp_path / "task.yaml"
    if how == "infra":  # resources.infra: slurm/PARTITION, as SkyPilot writes it
        task.write_text(TASK.format(partition=slurm.partition))
        flags = []
    else:  # skyward launch --infra slurm task.yaml, the file naming no infra
        task.write_text(TASK.replace("resources:\n  infra: slurm/{partition}\n", ""))
        flags = ["--infra", "slurm"]
    env = {**slurm.env, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-m", "skyward.cli", "launch", str(task), "-y", *flags], env=env,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout + done.stderr
    where = f"Slurm partition {slurm.partition}" if how == "infra" else "the default Slurm partition"
    assert f"2 node(s) of {where}" in done.stdout
    for rank, node in enumerate(slurm.nodes):
        assert f"rank {rank} of 2 on {node}" in done.stdout + done.stderr


def test_skypilots_mingpt_recipe_trains_across_the_allocation_with_torchrun(slurm) -> None:
    # `skyward launch --infra slurm` on the recipe as it ships (torchrun from the SKYPILOT_*
    # variables, the head's NodeAddr as MASTER_ADDR), CPU torch and gloo, a few steps.
    pytest.importorskip("torch")
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-m", "skyward.cli", "launch", "--infra", "slurm", "-y",
                           "examples/mingpt/train.yaml", "--env", "MINGPT_STEPS=3",
                           "--env", f"MINGPT_PORT={free_port()}"],
                          cwd=root, env={**slurm.env, "PYTHONPATH": str(root)}, capture_output=True, text=True,
                          timeout=240, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2 node(s) of the default Slurm partition" in done.stdout
    assert "mingpt: world of 2 rank(s) on 2 node(s); all_reduce saw ranks [0, 1]" in done.stdout
    assert "[node 0] mingpt: done: 3 steps across 2 rank(s)" in done.stdout
    assert "weights identical on every rank" in done.stdout
    assert slurm.jobs() == [] and slurm.processes(b"torchrun", b"main.py") == []  # (nothing left, at once)


@pytest.mark.parametrize(("flags", "accepted"), [
    ({"infra": "gcp"}, "a provider Skyward has"),
    ({"infra": "slurm/a/b"}, "slurm/PARTITION"),
    ({"infra": "slurm", "provider": "aws"}, "--infra or --provider, not both"),
])
def test_a_bad_infra_flag_is_refused_naming_it(tmp_path, flags, accepted) -> None:
    from skyward.launch import plan

    task = tmp_path / "task.yaml"
    task.write_text("run: echo\n")
    with pytest.raises(sky.ConfigError) as caught:
        plan(str(task), **flags)
    assert "--infra" in str(caught.value) and accepted in str(caught.value)
