"""Who reads a worker's replies: a caller blocked in ``>>`` reads its own; the reader thread
serves futures and listens while nobody calls. Both must hand the stream over without losing,
duplicating or tearing a frame, whatever happens in between (timeouts, Ctrl-C, a dying worker).
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

import skyward as sky
from skyward.pool import connection as _node
from tests.conftest import pid_alive


@sky.compute
def echo(x: object) -> object:
    return x


@sky.compute
def nap(seconds: float, x: object = None) -> object:
    time.sleep(seconds)
    return x


@sky.compute
def chatty(n: int) -> int:
    for i in range(n):
        print(f"line {i}")
    return n


@sky.compute
def blob(mib: int) -> bytes:
    return bytes(mib << 20)


@sky.compute(timeout=0.5)
def too_slow() -> None:
    for _ in range(3000):
        time.sleep(0.01)


@sky.compute
def busy(seconds: float) -> None:
    """Runs Python code all along (an interrupt lands between two bytecodes)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.005)


@pytest.fixture
def pool1():
    with sky.ComputePool(nodes=1, console=False) as pool:
        yield pool


def _conn(pool: sky.ComputePool) -> _node.NodeConnection:
    (conn,) = pool._connections
    return conn


def test_a_blocked_caller_reads_its_own_reply(pool1, monkeypatch) -> None:
    conn = _conn(pool1)
    assert echo(0) >> pool1 == 0  # the first call asks the reader thread to stand down
    read_by_caller = []
    original = _node.NodeConnection._read_until

    def spy(self, *args):
        read_by_caller.append(threading.get_ident())
        return original(self, *args)

    monkeypatch.setattr(_node.NodeConnection, "_read_until", spy)
    assert [echo(i) >> pool1 for i in range(50)] == list(range(50))
    assert len(read_by_caller) >= 49 and set(read_by_caller) == {threading.get_ident()}
    assert conn._reading is None  # parked: nothing in flight, nobody reading


def test_futures_and_blocking_calls_interleave(pool1) -> None:
    for _ in range(3):
        pending = [nap(0.05, i) > pool1 for i in range(3)]  # served by the reader thread
        mixed = [echo(i) >> pool1 for i in range(5)]  # read by the caller, behind the futures
        assert mixed == list(range(5))
        assert [f.result(10) for f in pending] == [0, 1, 2]
        assert [echo(i) >> pool1 for i in range(5)] == list(range(5))
        later = echo("late") > pool1  # the reader thread must wake up from its parking
        assert later.result(5) == "late"


def test_callers_on_many_threads_each_get_their_own_result(pool1) -> None:
    results: dict[int, list[object]] = {}

    def caller(k: int) -> None:
        results[k] = [echo((k, i)) >> pool1 for i in range(100)]

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {k: [(k, i) for i in range(100)] for k in range(4)}


def test_output_printed_during_a_blocking_call_still_arrives(pool1) -> None:
    lines: list[str] = []
    from skyward import events

    pool1.subscribe(lambda e: lines.append(e.line) if isinstance(e, events.TaskOutput) else None)
    echo(0) >> pool1
    assert chatty(20) >> pool1 == 20
    assert lines == [f"line {i}" for i in range(20)]


def test_a_timeout_ends_a_blocking_call_that_reads_its_own_reply(pool1) -> None:
    echo(0) >> pool1
    start = time.monotonic()
    with pytest.raises(sky.TaskTimeout):
        too_slow() >> pool1
    assert time.monotonic() - start < 3
    assert echo("after") >> pool1 == "after"


def test_a_worker_dying_under_a_blocking_call_raises_worker_lost_promptly(pool1) -> None:
    echo(0) >> pool1
    pid = pool1.worker_pids()[0]
    threading.Timer(0.3, os.kill, args=(pid, signal.SIGKILL)).start()
    start = time.monotonic()
    with pytest.raises(sky.WorkerLost):
        nap(30) >> pool1
    assert time.monotonic() - start < 5


def test_a_worker_dying_while_nobody_calls_is_noticed(pool1) -> None:
    echo(0) >> pool1  # leaves the stream parked
    conn = _conn(pool1)
    os.kill(pool1.worker_pids()[0], signal.SIGKILL)
    deadline = time.monotonic() + 5
    while conn.alive and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not conn.alive and isinstance(conn.lost, sky.WorkerLost)


@pytest.mark.parametrize("delay", [0.05, 0.2, 0.35, 0.5])
def test_ctrl_c_during_a_blocking_call_never_tears_the_stream(pool1, delay) -> None:
    """Wherever the interrupt lands (waiting, or in the middle of a 64 MiB reply), the call
    raises KeyboardInterrupt and the next calls get their own, intact results."""
    echo(0) >> pool1
    timer = threading.Timer(delay, os.kill, args=(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        for _ in range(50):
            assert len(blob(64) >> pool1) == 64 << 20
    except KeyboardInterrupt:
        pass
    else:
        pytest.fail("the interrupt never reached the caller")
    finally:
        timer.join()
    assert [echo(i) >> pool1 for i in range(20)] == list(range(20))
    assert len(blob(1) >> pool1) == 1 << 20
    assert pid_alive(pool1.worker_pids()[0])


def test_a_long_task_still_has_its_cancel_read_promptly(pool1) -> None:
    """With one slot the worker waits a little before reading behind a running task; a CANCEL
    must still reach a long task quickly."""
    future = busy(30) > pool1
    time.sleep(0.3)
    start = time.monotonic()
    pool1._connections[0].interrupt(future)
    with pytest.raises(sky.TaskCancelled):
        future.result(5)
    assert time.monotonic() - start < 1.0
    assert echo(1) >> pool1 == 1


def test_an_unguarded_handler_installed_later_makes_calls_wait_for_the_reader_thread(pool1, monkeypatch) -> None:
    """A SIGINT handler someone installs over the pool's could interrupt a frame: then the
    caller must not read the stream itself (and everything still works)."""
    calls = []
    monkeypatch.setattr(_node.NodeConnection, "_read_until", lambda *a: calls.append(a))
    previous = signal.signal(signal.SIGINT, lambda signum, frame: None)
    try:
        assert [echo(i) >> pool1 for i in range(30)] == list(range(30))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert calls == []


def test_the_pool_puts_the_signal_handlers_back_when_it_closes() -> None:
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with sky.ComputePool(nodes=1, console=False) as pool:
        from skyward import _signals

        assert isinstance(signal.getsignal(signal.SIGINT), _signals.Guard)
        assert isinstance(signal.getsignal(signal.SIGTERM), _signals.Guard)
        assert echo(1) >> pool == 1
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


@pytest.mark.parametrize("value", ["0", "50", "2000"])
def test_the_spin_window_can_be_set_or_turned_off(monkeypatch, value) -> None:
    monkeypatch.setenv("SKYWARD_SPIN_US", value)
    with sky.ComputePool(nodes=1, console=False) as pool:
        assert _conn(pool).spin == int(value) / 1e6
        assert [echo(i) >> pool for i in range(50)] == list(range(50))
        assert nap(0.2, "slow") >> pool == "slow"  # longer than any spin: blocks, then wakes


@pytest.mark.parametrize("value", ["-1", "fast", "1.5"])
def test_a_bad_spin_window_is_a_config_error_naming_the_variable(monkeypatch, value) -> None:
    monkeypatch.setenv("SKYWARD_SPIN_US", value)
    with pytest.raises(sky.ConfigError, match="SKYWARD_SPIN_US"):
        sky.ComputePool(nodes=1, console=False)


@sky.compute
def corrupt_stream(pipe_inode: int) -> None:
    """Write garbage into the worker's own reply pipe (found by its inode), then wait."""
    for fd in map(int, os.listdir("/proc/self/fd")):
        try:
            if os.fstat(fd).st_ino == pipe_inode and os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:"):
                flags = open(f"/proc/self/fdinfo/{fd}").read()
                if "flags:\t0" in flags and int(flags.split("flags:\t")[1].split()[0], 8) & os.O_WRONLY:
                    os.write(fd, b"\x7f" * 64)
        except OSError:
            continue
    time.sleep(30)


def test_a_corrupt_stream_under_a_blocking_call_is_worker_lost(pool1) -> None:
    echo(0) >> pool1  # the caller reads its own replies from now on
    inode = os.fstat(_conn(pool1).channel.stdout.fileno()).st_ino
    start = time.monotonic()
    with pytest.raises(sky.WorkerLost, match="stream broke"):
        corrupt_stream(inode) >> pool1
    assert time.monotonic() - start < 10
