"""A lost worker is reported promptly; leaving the pool's block, on any path, leaves nothing
behind (no worker, no process a task started) and puts the signal handlers back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest

import skyward as sky
from skyward import events as ev
from tests.conftest import pid_alive, wait_gone
from tests.contract.tasks import announce_then_hold, echo


@sky.compute
def start_child() -> int:
    """Start a process that outlives the task (not detached: the worker's own group)."""
    return subprocess.Popen(["sleep", "3600"]).pid


#: A daemon the classic way: fork, new session, fork again; the grandchild prints its pid.
DAEMON = """
import os, sys, time
if os.fork():
    os._exit(0)
os.setsid()
if os.fork():
    os._exit(0)
sys.stdout.write(f"{os.getpid()}\\n")
sys.stdout.flush()
os.close(1)
time.sleep(3600)
"""


@sky.compute
def start_detached(own_env: bool = False) -> list[int]:
    """Start a process in a session of its own and a double-forked daemon; their pids. With
    ``own_env``, both get an environment of their own (nothing of the worker's)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")} if own_env else None
    session = subprocess.Popen(["sleep", "3600"], start_new_session=True, stdin=subprocess.DEVNULL, env=env)
    daemon = subprocess.Popen([sys.executable, "-c", DAEMON], stdout=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    assert daemon.stdout is not None
    pid = int(daemon.stdout.readline())
    daemon.wait()
    return [session.pid, pid]


def worker_command(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode()


def running_pool_processes(pool: sky.ComputePool) -> list[int]:
    """The pool's worker processes and a child process a task started on every node."""
    workers = pool.worker_pids()
    assert len(workers) == 2 and all(isinstance(p, int) for p in workers)
    assert all("skyward.worker" in worker_command(p) for p in workers)  # this machine's pid namespace
    children = start_child() @ pool
    assert all(pid_alive(p) for p in [*workers, *children])
    return [*workers, *children]


def kill_worker_once_started(pool: sky.ComputePool, tag: str, killed: list[tuple[float, int]]) -> None:
    """SIGKILL the worker of the first node whose task prints ``"<tag> started on <node>"``."""

    def on_event(event: ev.Event) -> None:
        if isinstance(event, ev.TaskOutput) and event.line.startswith(f"{tag} started on ") and not killed:
            node = int(event.line.rsplit(" ", 1)[1])
            killed.append((time.monotonic(), node))
            os.kill(pool.worker_pids()[node], signal.SIGKILL)

    pool.subscribe(on_event)


@sky.compute
def corrupt_the_reply_stream() -> None:
    """Write garbage where the worker writes its replies: the pipes it writes that are not stderr."""
    stderr = os.fstat(2).st_ino
    for fd in map(int, os.listdir("/proc/self/fd")):
        try:
            flags = int(open(f"/proc/self/fdinfo/{fd}").read().split("flags:\t")[1].split()[0], 8)
            if (os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:") and flags & os.O_ACCMODE == os.O_WRONLY
                    and os.fstat(fd).st_ino != stderr):
                os.write(fd, b"\x7f" * 64)
        except OSError:
            continue
    time.sleep(30)


def test_a_worker_killed_under_a_blocking_call_raises_worker_lost_naming_its_node_promptly(
        new_pool: Callable[..., sky.ComputePool], tag: str, tmp_path) -> None:
    with new_pool() as pool:
        killed: list[tuple[float, int]] = []
        kill_worker_once_started(pool, tag, killed)
        with pytest.raises(sky.WorkerLost) as info:
            announce_then_hold(tag, str(tmp_path / "never"), 60) >> pool
        took = time.monotonic() - killed[0][0]
    node = killed[0][1]
    assert info.value.node == node and str(info.value).startswith(f"node {node}: ")
    assert took < 5, f"WorkerLost came {took:.1f}s after the kill (idle timeout: 30s)"


def test_worker_lost_carries_the_killed_workers_exit_code_and_last_output(
        request: pytest.FixtureRequest, new_pool: Callable[..., sky.ComputePool], tag: str, tmp_path) -> None:
    with new_pool() as pool:
        killed: list[tuple[float, int]] = []
        kill_worker_once_started(pool, tag, killed)
        with pytest.raises(sky.WorkerLost) as info:
            announce_then_hold(tag, str(tmp_path / "never"), 60) @ pool
    node = killed[0][1]
    assert info.value.node == node
    assert f"{tag} started on {node}" in info.value.log_tail
    assert info.value.exit_code == -signal.SIGKILL
    assert "killed by SIGKILL" in str(info.value)


def test_a_worker_killed_while_nothing_runs_is_noticed_and_named_by_the_next_call(
        new_pool: Callable[..., sky.ComputePool]) -> None:
    with new_pool() as pool:
        lost = threading.Event()
        pool.subscribe(lambda e: lost.set() if isinstance(e, ev.NodeStage) and e.stage == "lost" and e.node == 1
                       else None)
        assert echo(0) @ pool == [0, 0]
        os.kill(pool.worker_pids()[1], signal.SIGKILL)
        assert lost.wait(5), "no NodeStage(node=1, stage='lost') event within 5s of the kill"
        with pytest.raises(sky.WorkerLost) as info:
            echo(1) @ pool
        assert info.value.node == 1


@sky.compute
def end_the_streams_then_hold(flag: str) -> None:
    """On node 1: end the worker's side of its reply stream (close the pipes it writes that are
    not stderr, shut the sockets for writing), say so with ``flag``, then hold: the client sees
    the stream end while the worker lives on (until its next heartbeat finds the stream gone
    and it exits, code 2, or the client kills it), so its exit code comes a while later."""
    import socket

    if sky.instance_info().node != 1:
        return
    stderr = os.fstat(2).st_ino
    for fd in map(int, os.listdir("/proc/self/fd")):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            if fd <= 2 or os.fstat(fd).st_ino == stderr:
                continue
            flags = int(open(f"/proc/self/fdinfo/{fd}").read().split("flags:\t")[1].split()[0], 8)
            if target.startswith("pipe:") and flags & os.O_ACCMODE == os.O_WRONLY:
                os.close(fd)
            elif target.startswith("socket:"):
                socket.socket(fileno=os.dup(fd)).shutdown(socket.SHUT_WR)
        except OSError:
            continue
    open(flag, "w").close()
    time.sleep(30)


def test_a_loss_noticed_by_the_next_call_carries_the_exit_code(
        new_pool: Callable[..., sky.ComputePool], tmp_path) -> None:
    """The stream's end is noticed first by the connection's reader, which then waits for the
    exit code; a call made meanwhile gets that same error, exit code included (it got
    "worker is not running" and no exit code, under load in the flaky
    ``test_a_killed_workers_detached_processes_end_with_it``)."""
    flag = tmp_path / "closed"  # (/tmp is shared with the SSH hosts)
    with new_pool() as pool:
        assert len(echo(0) @ pool) == 2
        ended = [end_the_streams_then_hold(str(flag)) > pool for _ in range(2)]
        assert wait_for_path(flag, 30)
        time.sleep(0.2)  # the reader has seen the end; the exit code comes about a second later
        with pytest.raises(sky.WorkerLost) as info:
            echo(0) @ pool
        assert info.value.node == 1 and info.value.exit_code is not None, repr(info.value)
        with pytest.raises(sky.WorkerLost) as same:
            ended[1].result(timeout=30)
        assert same.value is info.value


def wait_for_path(path, timeout: float) -> bool:
    """Wait until ``path`` exists."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_corrupt_reply_stream_is_worker_lost(new_pool: Callable[..., sky.ComputePool]) -> None:
    with new_pool() as pool:
        assert echo(0) >> pool == 0
        started = time.monotonic()
        with pytest.raises(sky.WorkerLost, match="stream broke"):
            corrupt_the_reply_stream() >> pool
        assert time.monotonic() - started < 10


def test_leaving_the_block_stops_every_worker_and_every_process_a_task_started(
        new_pool: Callable[..., sky.ComputePool]) -> None:
    with new_pool() as pool:
        processes = running_pool_processes(pool)
    assert wait_gone(processes, 5) == []


def test_an_exception_in_the_block_propagates_and_nothing_is_left_running(
        new_pool: Callable[..., sky.ComputePool]) -> None:
    with pytest.raises(RuntimeError, match="^user code failed$"):
        with new_pool() as pool:
            processes = running_pool_processes(pool)
            raise RuntimeError("user code failed")
    assert wait_gone(processes, 5) == []


def test_closing_the_pool_puts_back_the_signal_handlers_it_found(new_pool: Callable[..., sky.ComputePool]) -> None:
    def on_sigint(signum, frame) -> None: ...
    def on_sigterm(signum, frame) -> None: ...

    saved = signal.signal(signal.SIGINT, on_sigint), signal.signal(signal.SIGTERM, on_sigterm)
    try:
        with new_pool() as pool:
            assert echo(1) @ pool == [1, 1]
        assert signal.getsignal(signal.SIGINT) is on_sigint
        assert signal.getsignal(signal.SIGTERM) is on_sigterm
    finally:
        signal.signal(signal.SIGINT, saved[0])
        signal.signal(signal.SIGTERM, saved[1])


def test_no_process_a_task_started_outlives_the_pool_however_detached(
        new_pool: Callable[..., sky.ComputePool]) -> None:
    with new_pool() as pool:
        detached = [pid for node in start_detached() @ pool for pid in node]
        assert len(detached) == 4 and all(pid_alive(p) for p in detached)
    # Teardown confirmed it: they are gone when the block is left, not some time later.
    assert wait_gone(detached, 0.5) == []


def parent_worker_process(pid: int) -> int:
    """``pid``'s parent, checked to be a ``python -m skyward.worker`` process (a keeper)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        parent = int(f.read().rsplit(b")", 1)[1].split()[1])
    assert "skyward.worker" in worker_command(parent), f"{pid}'s parent is not one of the worker's keepers"
    return parent


@pytest.mark.parametrize("killed", ["keeper", "guard"])
def test_a_killed_keeper_leaves_no_detached_process_behind(
        new_pool: Callable[..., sky.ComputePool], killed: str) -> None:
    """Killed with SIGKILL, a keeper can do nothing: the one above it (or below, for the guard)
    clears the worker's tree at once, with the pool still open. The detached processes have an
    environment of their own, so nothing but the tree can find them."""
    with new_pool() as pool:
        per_node = start_detached(own_env=True) @ pool
        keeper = parent_worker_process(pool.worker_pids()[1])
        os.kill(keeper if killed == "keeper" else parent_worker_process(keeper), signal.SIGKILL)
        assert wait_gone(per_node[1], 5) == []
        assert all(pid_alive(p) for p in per_node[0])  # the other node's are its own business
        with pytest.raises(sky.WorkerLost) as info:
            for _ in range(100):  # (the loss may be noticed only after a call or two)
                echo(0) @ pool
                time.sleep(0.05)
        assert info.value.node == 1
    assert wait_gone(per_node[0], 0.5) == []


def test_a_worker_group_killed_at_once_leaves_its_detached_processes_to_teardown(
        new_pool: Callable[..., sky.ComputePool]) -> None:
    """``kill -9`` of a worker's whole process group kills both keepers at once: its detached
    processes go to init, and the pool's teardown ends them by the tree's tag."""
    with new_pool() as pool:
        per_node = start_detached() @ pool
        worker = pool.worker_pids()[1]
        with open(f"/proc/{worker}/stat", "rb") as f:
            group = int(f.read().rsplit(b")", 1)[1].split()[2])
        os.killpg(group, signal.SIGKILL)
        assert wait_gone([worker], 5) == []
    assert wait_gone([*per_node[0], *per_node[1]], 0.5) == []


def test_a_killed_workers_detached_processes_end_with_it(new_pool: Callable[..., sky.ComputePool]) -> None:
    with new_pool() as pool:
        per_node = start_detached() @ pool
        assert all(pid_alive(p) for p in per_node[1])
        os.kill(pool.worker_pids()[1], signal.SIGKILL)
        assert wait_gone(per_node[1], 5) == []
        assert all(pid_alive(p) for p in per_node[0])  # the other node's are its own business
        with pytest.raises(sky.WorkerLost) as info:
            echo(0) @ pool
        assert info.value.node == 1 and info.value.exit_code == -signal.SIGKILL
    assert wait_gone(per_node[0], 0.5) == []
