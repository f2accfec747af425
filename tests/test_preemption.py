"""Spot preemption notices on a node: the metadata watcher against a stand-in IMDS on loopback,
and what a task's process does with a notice (``instance_info().preempting``, ``on_preempt``).

The pool-level path (an AWS spot pool whose instance is an SSH test host, the stand-in at
IMDS's real address in the host's namespace) is in test_aws_preemption.py.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

import skyward as sky
from skyward.runtime import preemption as _preempt
from skyward.testing import forget_preemptions
from skyward.worker import preemption
from tests.hosts import imds


@pytest.fixture(autouse=True)
def fresh_process_state():
    """Notices and callbacks are per process: each test starts with none and leaves none."""
    forget_preemptions()
    yield
    forget_preemptions()


def watcher_for(server: imds.StandIn) -> tuple[preemption.PreemptionWatcher, list[sky.Preemption]]:
    seen: list[sky.Preemption] = []
    # (a generous timeout per request: on a loaded machine the stand-in answers late, not never)
    client = preemption.MetadataClient(server.endpoint, timeout=30.0)
    return preemption.PreemptionWatcher(seen.append, client), seen


def wait_for(predicate, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


# -- the watcher ------------------------------------------------------------------------------------


def test_the_watcher_sees_nothing_before_the_interruption_notice_then_reports_it_once():
    with imds.on_loopback() as server:
        watcher, seen = watcher_for(server)
        watcher.poll()
        assert seen == []
        assert {(r["path"], r["status"]) for r in server.requests if r["method"] == "GET"} == {
            (imds.INTERRUPTION_PATH, 404), (imds.REBALANCE_PATH, 404)}
        at = server.interrupt("stop", in_seconds=110)
        watcher.poll()
        watcher.poll()
    assert seen == [sky.Preemption("interruption", "stop", at)]
    assert 100 < seen[0].seconds_left <= 111
    assert seen[0].at.tzinfo is not None


def test_a_rebalance_recommendation_is_its_own_kind_and_the_interruption_still_follows():
    with imds.on_loopback() as server:
        watcher, seen = watcher_for(server)
        noticed = server.rebalance()
        watcher.poll()
        assert seen == [sky.Preemption("rebalance", None, noticed)]
        at = server.interrupt()
        watcher.poll()
    assert [n.kind for n in seen] == ["rebalance", "interruption"]
    assert seen[1].at == at and seen[1].action == "terminate"


def test_imdsv2_tokens_are_used_and_renewed_when_refused():
    with imds.on_loopback() as server:
        watcher, seen = watcher_for(server)
        watcher.poll()
        assert [r["method"] for r in server.requests][:1] == ["PUT"]
        assert all(r["token"] for r in server.requests if r["method"] == "GET")
        server.expire_tokens()
        server.interrupt()
        watcher.poll()
        assert [n.kind for n in seen] == ["interruption"]
        puts = [r for r in server.requests if r["method"] == "PUT"]
        assert len(puts) == 2, server.requests  # the refused token was replaced, once


def test_imdsv1_is_used_when_the_token_request_is_refused():
    with imds.on_loopback(v1_only=True) as server:
        watcher, seen = watcher_for(server)
        server.interrupt("hibernate")
        watcher.poll()
    assert [(n.kind, n.action) for n in seen] == [("interruption", "hibernate")]
    assert [r["token"] for r in server.requests if r["method"] == "GET"] == [False, False]


def test_the_watcher_is_quiet_when_no_metadata_service_answers():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    seen: list[sky.Preemption] = []
    watcher = preemption.PreemptionWatcher(seen.append, preemption.MetadataClient(f"http://127.0.0.1:{port}"))
    for _ in range(3):
        watcher.poll()  # no exception, nothing reported
    assert seen == []


def test_a_notice_reaches_on_preempt_and_instance_info_through_the_endpoint_variable(monkeypatch):
    """The worker's path: watch() (endpoint from AWS_EC2_METADATA_SERVICE_ENDPOINT, as AWS's
    SDKs read it) -> deliver -> the callback, once; instance_info().preempting meanwhile."""
    ran: list[sky.Preemption] = []
    stop = threading.Event()
    with imds.on_loopback() as server:
        monkeypatch.setenv(preemption.ENDPOINT_VAR, server.endpoint)
        sky.on_preempt(ran.append)
        thread = preemption.watch(_preempt.deliver, stop, interval=0.05)
        try:
            assert wait_for(lambda: len([r for r in server.requests if r["method"] == "GET"]) >= 4)
            assert sky.instance_info().preempting is None and ran == []
            at = server.interrupt()
            assert wait_for(lambda: ran), "the callback did not run"
            assert sky.instance_info().preempting == sky.Preemption("interruption", "terminate", at)
        finally:
            stop.set()
            thread.join(5)
    assert not thread.is_alive()
    assert ran == [sky.Preemption("interruption", "terminate", at)]


# -- a task's process ------------------------------------------------------------------------------

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
INTERRUPTION = sky.Preemption("interruption", "terminate", NOW)
REBALANCE = sky.Preemption("rebalance", None, NOW)


def test_callbacks_run_once_on_a_thread_of_their_own_for_the_interruption():
    threads: list[str] = []
    done = threading.Event()

    def callback(notice: sky.Preemption) -> None:
        threads.append(threading.current_thread().name)
        done.set()

    sky.on_preempt(callback)
    assert _preempt.deliver(REBALANCE)  # a rebalance is not what it waits for
    time.sleep(0.2)
    assert threads == []
    assert sky.instance_info().preempting == REBALANCE
    assert _preempt.deliver(INTERRUPTION)
    assert done.wait(60)
    assert not _preempt.deliver(INTERRUPTION)  # a second copy changes nothing
    time.sleep(0.2)
    assert threads == ["skyward-on-preempt"]
    assert sky.instance_info().preempting == INTERRUPTION


def test_rebalance_true_runs_on_the_recommendation_and_late_registrations_run_at_once():
    early: list[str] = []
    sky.on_preempt(lambda n: early.append(n.kind), rebalance=True)
    _preempt.deliver(REBALANCE)
    assert wait_for(lambda: early == ["rebalance"])
    _preempt.deliver(INTERRUPTION)
    late: list[str] = []
    sky.on_preempt(lambda n: late.append(n.kind))
    assert wait_for(lambda: late == ["interruption"])
    time.sleep(0.2)
    assert early == ["rebalance"]  # once, whatever follows


def test_a_failing_callback_is_printed_on_stderr_and_stops_nothing_else(capfd):
    ran = threading.Event()

    def broken(notice: sky.Preemption) -> None:
        raise ValueError("disk full")

    sky.on_preempt(broken)
    sky.on_preempt(lambda n: ran.set())
    _preempt.deliver(INTERRUPTION)
    assert ran.wait(60)
    text = ""
    deadline = time.monotonic() + 60  # (generous: a loaded machine is slow, not wrong)
    while "ValueError: disk full" not in text and time.monotonic() < deadline:
        text += capfd.readouterr().err
        time.sleep(0.02)
    assert "on_preempt callback" in text and "ValueError: disk full" in text


def test_an_unregistered_callback_never_runs_and_outside_a_pool_nothing_fires():
    ran: list[str] = []
    cancel = sky.on_preempt(lambda n: ran.append("cancelled one"))
    sky.on_preempt(lambda n: ran.append("kept"))
    cancel()
    time.sleep(0.2)
    assert ran == [] and sky.instance_info().preempting is None  # no pool, no notice
    _preempt.deliver(INTERRUPTION)
    assert wait_for(lambda: ran == ["kept"])
    time.sleep(0.1)
    assert ran == ["kept"]


def test_on_preempt_refuses_what_is_not_callable():
    with pytest.raises(sky.ConfigError, match="callback"):
        sky.on_preempt("save()")  # type: ignore[arg-type]


def test_the_spot_checkpoint_example_runs_through_where_no_notice_comes(tmp_path):
    """examples/spot_checkpoint.py (on the preemption page) runs on Local, as a reader would."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "SKYWARD_CONSOLE": "plain", "PYTHONPATH": str(root), "TMPDIR": str(tmp_path)}
    env.pop("SKYWARD_EXAMPLE_AWS", None)
    done = subprocess.run([sys.executable, "examples/spot_checkpoint.py"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "every node reached its last step or saved before its machine went: True" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
