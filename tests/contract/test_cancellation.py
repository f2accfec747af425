"""Timeouts, cancellation, a failing broadcast and Ctrl-C stop tasks promptly and leave the
pool usable."""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import CancelledError

import pytest

import skyward as sky
from skyward import events as ev
from tests.contract.conftest import Output
from tests.contract.tasks import announce_then_hold, echo, wait_for_file


@sky.compute(timeout=0.5)
def overruns(seconds: float) -> str:
    for _ in range(int(seconds / 0.01)):  # short sleeps: the timeout lands between them
        time.sleep(0.01)
    return "finished"


@sky.compute(timeout=10)
def node_soon() -> int:
    """The node's number, or TaskTimeout if its slot stays busy (instead of waiting on)."""
    return sky.instance_info().node


@sky.compute
def node1_fails_once_node0_runs(started: str) -> str:
    if sky.instance_info().node == 0:
        open(started, "w").close()
        for _ in range(6000):  # a minute, unless stopped
            time.sleep(0.01)
        return "node 0 was never stopped"
    wait_for_file(started, 20)
    raise ValueError("node 1 failed")


@sky.compute
def blob(mib: int) -> bytes:
    return bytes(mib << 20)


def test_a_task_past_its_timeout_raises_task_timeout_and_its_slot_is_freed(pool: sky.ComputePool) -> None:
    started = time.monotonic()
    with pytest.raises(sky.TaskTimeout) as info:
        overruns(60) >> pool
    assert time.monotonic() - started < 5
    assert (info.value.task, info.value.timeout) == ("overruns", 0.5)
    assert info.value.node in (0, 1)
    # Both slots are free at once: the cancel reached the worker although a task was running.
    started = time.monotonic()
    assert node_soon() @ pool == [0, 1]
    assert time.monotonic() - started < 3


def test_cancelling_the_future_of_a_running_task_stops_it(request: pytest.FixtureRequest, pool: sky.ComputePool,
                                                          output: Output, tag: str, tmp_path) -> None:
    release = tmp_path / "release"
    future = announce_then_hold(tag, str(release), 60) > pool
    try:
        output.wait_for(f"{tag} started")
        assert future.cancel()
        with pytest.raises(CancelledError):
            future.result(timeout=5)
        assert node_soon() @ pool == [0, 1]  # its slot is free: the task was stopped
    finally:
        release.touch()  # whatever happened, the task ends and leaves the pool clean
        if not future.cancelled():
            future.result(timeout=30)


def test_a_broadcast_failing_on_one_node_stops_the_others_promptly(pool: sky.ComputePool, tmp_path) -> None:
    started = time.monotonic()
    with pytest.raises(ValueError) as info:
        node1_fails_once_node0_runs(str(tmp_path / "node0-running")) @ pool
    assert str(info.value) == "node 1 failed"
    assert time.monotonic() - started < 5
    assert node_soon() @ pool == [0, 1]  # node 0's slot is free: its copy was stopped


def test_ctrl_c_while_blocked_in_rshift_raises_and_the_pool_stays_usable(pool: sky.ComputePool, tag: str,
                                                                         tmp_path, ctrl_c) -> None:
    release = tmp_path / "release"

    def interrupt_once_started(event: ev.Event) -> None:
        if isinstance(event, ev.TaskOutput) and event.line.startswith(f"{tag} started"):
            os.kill(os.getpid(), signal.SIGINT)

    unsubscribe = pool.subscribe(interrupt_once_started)
    try:
        with pytest.raises(KeyboardInterrupt):
            announce_then_hold(tag, str(release), 60) >> pool
    finally:
        unsubscribe()
        release.touch()  # the interrupted task ends; its late reply must go nowhere
    assert [echo(i) >> pool for i in range(20)] == list(range(20))
    assert node_soon() @ pool == [0, 1]


def test_ctrl_c_landing_anywhere_in_large_replies_never_tears_the_stream(pool: sky.ComputePool, ctrl_c) -> None:
    for delay in (0.0, 0.04, 0.12):  # where the interrupt lands: waiting, or mid-reply
        first_reply = threading.Event()

        def interrupt() -> None:
            first_reply.wait(30)
            time.sleep(delay)  # not synchronisation: it moves the interrupt along the replies
            os.kill(os.getpid(), signal.SIGINT)

        interrupter = threading.Thread(target=interrupt)
        interrupter.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                for _ in range(200):
                    assert len(blob(8) >> pool) == 8 << 20
                    if not first_reply.is_set():  # (once: the interrupt must not land inside set())
                        first_reply.set()
        finally:
            first_reply.set()
            interrupter.join()
        assert [echo((delay, i)) >> pool for i in range(10)] == [(delay, i) for i in range(10)]
        assert blob(1) @ pool == [bytes(1 << 20)] * 2


def test_a_sigint_handler_installed_over_the_pools_is_called_and_calls_stay_intact(pool: sky.ComputePool) -> None:
    received: list[int] = []
    first_reply = threading.Event()

    def interrupt() -> None:
        first_reply.wait(30)
        os.kill(os.getpid(), signal.SIGINT)

    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    interrupter = threading.Thread(target=interrupt)
    interrupter.start()
    try:
        sizes = []
        for _ in range(500):  # until the handler has run, mid-replies
            sizes.append(len(blob(2) >> pool))
            first_reply.set()
            if received:
                break
        sizes += [len(blob(2) >> pool) for _ in range(5)]
    finally:
        first_reply.set()
        interrupter.join()
        signal.signal(signal.SIGINT, previous)
    assert received == [signal.SIGINT]
    assert sizes == [2 << 20] * len(sizes)
    assert [echo(i) >> pool for i in range(10)] == list(range(10))
