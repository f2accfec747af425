"""Nothing leaks: every exit path of a pool leaves no worker process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import skyward as sky
from skyward.messages import Setup
from skyward.events import NodeStage
from skyward.protocol import FrameReader, FrameWriter, Kind, dumps_payload
from skyward.testing import connection
from tests.conftest import interactive_signals, pid_alive, wait_gone

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CLIENT = textwrap.dedent(
    """
    import sys, time
    import skyward as sky

    @sky.compute
    def sleep(s):
        time.sleep(s)
        return s

    with sky.ComputePool(nodes=2, console=False, idle_timeout={idle}) as pool:
        print("PIDS", *pool.worker_pids(), flush=True)
        future = sleep(60) > pool
        time.sleep(0.3)
        print("RUNNING", flush=True)
        sleep(60) >> pool
    """
)


def start_client(idle: float = 30.0) -> tuple[subprocess.Popen[str], list[int]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", CLIENT.format(idle=idle)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        preexec_fn=interactive_signals,  # Ctrl-C and SIGTERM as from a terminal, whatever ours are
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert first.startswith("PIDS"), first + proc.stderr.read()  # type: ignore[union-attr]
    pids = [int(p) for p in first.split()[1:]]
    assert proc.stdout.readline().startswith("RUNNING")
    assert all(pid_alive(p) for p in pids)
    return proc, pids


def test_normal_exit_stops_every_worker() -> None:
    with sky.ComputePool(nodes=2, console=False) as pool:
        pids = [p for p in pool.worker_pids() if p]
        assert len(pids) == 2
    assert wait_gone(pids, 0.1) == []
    assert not pool.is_open


def test_exception_in_block_stops_every_worker_and_propagates() -> None:
    with pytest.raises(RuntimeError, match="user error"):
        with sky.ComputePool(nodes=2, console=False) as pool:
            pids = [p for p in pool.worker_pids() if p]
            raise RuntimeError("user error")
    assert wait_gone(pids, 0.1) == []


def test_ctrl_c_in_block_leaves_no_worker() -> None:
    proc, pids = start_client()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    # One line instead of a traceback; the process still ends as interrupted by SIGINT.
    assert "skyward: interrupted: pool" in err and "Traceback" not in err, err
    assert proc.returncode in (-signal.SIGINT, 130)
    assert wait_gone(pids, 5) == []


def test_sigterm_runs_teardown() -> None:
    proc, pids = start_client()
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=20)
    assert proc.returncode == 128 + signal.SIGTERM
    assert wait_gone(pids, 5) == []


def test_sigkilled_client_leaves_no_worker_within_dead_man_timeout() -> None:
    proc, pids = start_client(idle=3.0)
    proc.kill()
    proc.wait(10)
    assert wait_gone(pids, 3.0 + 2) == []


def test_worker_exits_by_itself_when_the_client_goes_silent() -> None:
    """The dead man's switch without end-of-input: the client holds the pipe open, says nothing."""
    worker = subprocess.Popen(
        [sys.executable, "-m", "skyward.worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, cwd=ROOT, start_new_session=True,
    )
    try:
        writer = FrameWriter(worker.stdin)  # type: ignore[arg-type]
        reader = FrameReader(worker.stdout)  # type: ignore[arg-type]
        setup = Setup(info=sky.InstanceInfo(), env={}, concurrency=1, executor="thread",
                      idle_timeout=1.0, heartbeat_interval=0.2)
        writer.send((Kind.SETUP, setup), dumps_payload([]))
        frame = reader.recv()
        assert frame is not None and frame[0][0] == Kind.READY
        started = time.monotonic()
        code = worker.wait(timeout=10)
        assert 0.9 < time.monotonic() - started < 5
        assert code != 0
        assert b"no word from the client" in worker.stderr.read()  # type: ignore[union-attr]
    finally:
        worker.kill()
        worker.wait()


@sky.compute
def mark_and_sleep(path: str, seconds: float) -> None:
    with open(path, "a") as f:
        f.write("started\n")
    for _ in range(int(seconds / 0.05)):
        time.sleep(0.05)


def test_queued_tasks_do_not_start_once_the_pool_closes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    marks = [tmp_path / f"task{i}" for i in range(3)]
    with sky.ComputePool(nodes=1, console=False) as pool:
        futures = [mark_and_sleep(str(m), 1.0) > pool for m in marks]
        time.sleep(0.3)
    assert marks[0].exists()
    assert not marks[1].exists() and not marks[2].exists()
    for f in futures:
        with pytest.raises(sky.SkywardError):
            f.result(timeout=5)


def test_a_closed_pool_closes_its_pipes_to_its_workers_lost_ones_too() -> None:
    # Left open, each worker's three pipes were closed by the garbage collector, in whatever
    # test ran then (ResourceWarning: unclosed file), and held their descriptors until then.
    lost = threading.Event()
    with sky.ComputePool(nodes=2, console=False) as pool:
        pool.subscribe(lambda e: lost.set() if isinstance(e, NodeStage) and e.stage == "lost" else None)
        channels = [connection(pool, node).channel for node in range(2)]
        os.kill(pool.worker_pids()[1], signal.SIGKILL)
        assert lost.wait(30)
    assert [[s.closed for s in (c.stdin, c.stdout, c.stderr)] for c in channels] == [[True] * 3] * 2


COMMANDS = """
import gc
from skyward.transport.local import LocalTransport
here = LocalTransport()
assert here.run("echo out; echo err >&2").stderr == "err\\n"
assert here.stream("echo out", lambda stream, line: None) == 0
try:
    here.run("sleep 30", timeout=0.1)
except TimeoutError:
    pass
gc.collect()
print("done")
"""


def test_commands_run_on_this_machine_close_their_pipes() -> None:
    # Any file object freed unclosed raises here, with where it was made.
    done = subprocess.run([sys.executable, "-X", "tracemalloc=10", "-W", "error::ResourceWarning", "-c", COMMANDS],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, "done\n", "")
