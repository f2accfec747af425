"""sky.Slurm driven from elsewhere and refusing what Slurm could never grant, on a real Slurm
cluster (tests/slurm_cluster.py): a pool through a login node over SSH, a Ctrl-C while the login
node's request is held in the controller, a time limit above the partition's, GPUs the nodes
lack, and an allocation preempted by a higher-priority partition.

After every test Slurm runs no job of ours and no worker is left on any node."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import skyward as sky
from tests import slurm_cluster
from tests.conftest import free_port, interactive_signals
from tests.hosts.conftest_fixture import kept_bashrcs, ssh_provider

pytestmark = slurm_cluster.needs_slurm
slurm, nothing_left = slurm_cluster.slurm, slurm_cluster.nothing_left  # (the shared fixtures)


@sky.compute
def where() -> tuple[str, str | None]:
    import os
    import socket

    return socket.gethostname(), os.environ.get("SLURMD_NODENAME")


@sky.compute
def nap(seconds: float) -> None:
    import time

    time.sleep(seconds)


def test_a_pool_through_a_login_node_runs_every_slurm_command_there(slurm, test_hosts, wheelhouse,
                                                                    monkeypatch) -> None:
    login = test_hosts[0]
    # The login node's shell points Slurm's commands at the cluster, as a cluster's login node
    # does; this process's environment does not, so no Slurm command can have run here.
    monkeypatch.delenv("SLURM_CONF")
    # The environment is built once on the login node, in its ~/.skyward, which the compute nodes
    # see at the same path, as they share a login node's home (the host's home is a directory
    # of this machine, mounted over /root inside it: the path below names it for both).
    provider = sky.Slurm(login=ssh_provider([login], wheelhouse, root=f"{login.home}/.skyward"))
    with kept_bashrcs([login], f"export SLURM_CONF={slurm.conf}\n"):
        with sky.ComputePool(provider=provider, nodes=2, console=False, start_timeout=60) as pool:
            assert where() @ pool == [(n, n) for n in slurm.nodes]
            assert [line.split()[1:] for line in slurm.jobs()] == [[f"skyward-{pool.id}", "RUNNING"]]
            assert slurm.workers()  # (the steps' workers, found by the SLURM_CONF the login shell gave)


def test_an_unreachable_login_node_is_refused_naming_login(slurm) -> None:
    login = f"root@127.0.0.1:{free_port()}"  # (nothing listens there)
    with pytest.raises(sky.ConfigError) as caught:
        with sky.ComputePool(provider=sky.Slurm(login=login), nodes=1, console=False):
            pass
    assert caught.value.parameter == "login" and caught.value.got == login
    assert "refused" in str(caught.value) and "reachable over SSH" in caught.value.accepted


def test_a_time_limit_above_the_partitions_is_refused_before_anything_is_queued(slurm) -> None:
    provider = sky.Slurm(partition=slurm_cluster.URGENT, time="1:00:00")
    with pytest.raises(sky.ConfigError) as caught:  # (Slurm itself would let the job pend for ever)
        with sky.ComputePool(provider=provider, nodes=1, console=False, start_timeout=5):
            pass
    assert caught.value.parameter == "time" and caught.value.got == "1:00:00"
    assert slurm_cluster.URGENT_MAX_TIME in caught.value.accepted
    assert f"MaxTime={slurm_cluster.URGENT_MAX_TIME}" in caught.value.detail


def test_more_gpus_per_node_than_the_nodes_have_is_refused_before_anything_is_queued(slurm) -> None:
    with pytest.raises(sky.ConfigError) as caught:
        with sky.ComputePool(provider=sky.Slurm(), nodes=1, accelerator="A100:3", console=False, start_timeout=5):
            pass
    assert caught.value.parameter == "accelerator" and caught.value.got == "3 GPUs per node"
    assert f"at most {slurm_cluster.GPUS_PER_NODE} GPUs per node" in caught.value.accepted
    assert f"Gres=gpu:{slurm_cluster.GPUS_PER_NODE}" in caught.value.detail


def test_a_preempted_allocation_is_a_lost_node_and_replace_lost_queues_a_new_one(slurm) -> None:
    with sky.ComputePool(provider=sky.Slurm(), nodes=1, replace_lost=True, console=False, start_timeout=60) as pool:
        first = next(line.split()[0] for line in slurm.jobs())
        napping = nap(300) > pool
        # A job of the higher-priority partition wants every node: Slurm cancels ours for it.
        urgent = slurm.run("salloc", "--no-shell", "--exclusive", f"--partition={slurm_cluster.URGENT}",
                           f"--nodes={len(slurm.nodes)}", "--time=5", "--job-name=urgent")
        try:
            assert urgent.returncode == 0, urgent.stderr
            with pytest.raises(sky.WorkerLost) as caught:
                napping.result(timeout=60)
            assert f"Slurm job {first} is PREEMPTED" in str(caught.value)
        finally:
            slurm.run("scancel", "--name=urgent")
        pool.wait_ready(timeout=60)  # (a new allocation, granted once the urgent job is gone)
        assert where() @ pool in ([(n, n)] for n in slurm.nodes)
        jobs = [line.split() for line in slurm.jobs()]
        assert len(jobs) == 1 and jobs[0][0] != first and jobs[0][1] == f"skyward-{pool.id}"


LOGIN_CLIENT = """
import skyward as sky

login = sky.SSH([{ip!r}], user={user!r}, key={key!r}, known_hosts={known_hosts!r}, connect_timeout=5)
with sky.ComputePool(provider=sky.Slurm(login=login), nodes=2, start_timeout=300):
    pass
"""


@pytest.mark.parametrize("kind", ["allocation", "batch"])
def test_ctrl_c_while_slurm_handles_a_request_from_the_login_node_leaves_nothing_there(
        slurm, test_hosts, monkeypatch, tmp_path, kind) -> None:
    # The request (salloc on free nodes; sbatch behind a blocker, once salloc was refused) runs
    # on the login node and is held in the controller, sent and not granted, while a real Ctrl-C
    # reaches the client: the remote command must not go on to a job nobody holds.
    login = test_hosts[0]
    monkeypatch.delenv("SLURM_CONF")  # (only the login node's shell points at the cluster)
    if kind == "batch":
        blocker = slurm.run("salloc", "--no-shell", "--exclusive", f"--nodes={len(slurm.nodes)}", "--job-name=blocker")
        assert blocker.returncode == 0, blocker.stderr
    (tmp_path / "client.py").write_text(LOGIN_CLIENT.format(ip=login.ip, user=login.user, key=str(login.key_path),
                                                            known_hosts=str(login.known_hosts_all)))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    client = None
    try:
        with kept_bashrcs([login], f"export SLURM_CONF={slurm.conf}\n"), slurm.gate(kind) as gate:
            client = subprocess.Popen([sys.executable, str(tmp_path / "client.py")], env=env,
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True, preexec_fn=interactive_signals, start_new_session=True)
            name = gate.wait_held()
            os.killpg(client.pid, signal.SIGINT)
            command = "salloc" if kind == "allocation" else "sbatch"
            said = slurm_cluster.lines_until(client.stderr, f"waiting for Slurm's answer to {command}")
            gate.release()  # (the client waits on it, or has already gone)
            rest = said + client.stderr.read()
            assert client.wait(60) != 0, rest
        assert "nothing left running" in rest, rest
        assert [line.split()[1] for line in slurm.jobs()] == ([] if kind == "allocation" else ["blocker"]), rest
        assert requests_of(name) == [], rest  # (no salloc or sbatch of ours left on the login node)
        assert f"interrupted: waiting for Slurm's answer to {command}" in said, rest  # (the console says why)
    finally:
        if client is not None and client.poll() is None:
            client.kill()
            client.wait()
        slurm.run("scancel", "--name=blocker")


def requests_of(name: str) -> list[int]:
    """PIDs of the processes whose command line asks for a job named ``name`` (the test hosts
    share this machine's processes)."""
    mark = f"--job-name={name}".encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as f:
            if mark in f.read().split(b"\0"):
                found.append(int(pid))
    return found


@pytest.mark.parametrize("time", ["an hour", "1:00:00:00", "1-2-3", ""])
def test_a_time_slurm_cannot_read_is_refused_when_the_provider_is_made(time) -> None:
    with pytest.raises(sky.ConfigError) as caught:
        sky.Slurm(time=time)
    assert caught.value.parameter == "time" and caught.value.got == time
    assert "days-hours:minutes:seconds" in caught.value.accepted


def test_a_named_cluster_through_a_login_node_is_refused_naming_login() -> None:
    # (refused before the login node is contacted: 192.0.2.1 is a documentation address)
    with pytest.raises(sky.ConfigError) as caught:
        with sky.ComputePool(provider=sky.Slurm(login="root@192.0.2.1"), nodes=1, name="slurm-login-named",
                             console=False):
            pass
    assert caught.value.parameter == "login" and "named cluster" in str(caught.value)
