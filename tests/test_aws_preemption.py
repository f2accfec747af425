"""Spot preemption notices end to end: an AWS pool (moto) whose instance is an SSH test host,
with a stand-in instance metadata service at IMDS's real address inside the host's network
namespace (tests/hosts/imds.py). The worker's code is unchanged: it asks 169.254.169.254.

A spot node's worker watches; the notice reaches a task polling
``sky.instance_info().preempting``, a task that registered ``sky.on_preempt`` (in the process
that runs it, for both executors) and the client (``NodePreempting`` through ``on_event``).
An on-demand node does not watch at all.
"""

from __future__ import annotations

import ipaddress
import os
import threading
import time
import uuid
from pathlib import Path

import pytest

import skyward as sky
from skyward import events as ev
from skyward.providers.aws.provider import AWS
from skyward.worker.preemption import POLL_INTERVAL
from tests.aws_conftest import aws, moto_server  # noqa: F401  (fixtures)
from tests.contract.test_clusters import home  # noqa: F401  (a SKYWARD_HOME of the test's own)
from tests.hosts import imds, testhosts
from tests.test_aws_e2e import subnet_with_only
from tests.test_ssh import leftovers, wait_until, wheelhouse  # noqa: F401  (wheelhouse is a fixture)

pytestmark = pytest.mark.skipif(testhosts.unavailable_reason() is not None,
                                reason=str(testhosts.unavailable_reason()))


@sky.compute
def wait_for_preempting(ready: str, timeout: float) -> dict:
    """Poll instance_info().preempting, as a training loop would between steps."""
    Path(ready).touch()
    deadline = time.monotonic() + timeout
    kinds = []
    while time.monotonic() < deadline:
        notice = sky.instance_info().preempting
        if notice is not None and notice.kind not in kinds:
            kinds.append(notice.kind)
        if notice is not None and notice.kind == "interruption":
            return {"kinds": kinds, "action": notice.action, "at": notice.at, "pid": os.getpid()}
        time.sleep(0.05)
    return {"kinds": kinds, "action": None, "at": None, "pid": os.getpid()}


@sky.compute
def checkpoint_on_preempt(ready: str, timeout: float) -> dict:
    """Register a callback, then work until it has run."""
    calls = []
    done = threading.Event()

    def checkpoint(notice: sky.Preemption) -> None:
        calls.append({"kind": notice.kind, "at": notice.at, "pid": os.getpid(),
                      "thread": threading.current_thread().name})
        print("checkpoint saved")
        done.set()

    sky.on_preempt(checkpoint)
    Path(ready).touch()
    done.wait(timeout)
    time.sleep(0.3)  # a second run would show here
    return {"calls": calls, "pid": os.getpid()}


@sky.compute
def preempting_after(seconds: float) -> object:
    time.sleep(seconds)
    return sky.instance_info().preempting


def aws_on(aws_env, host, wheelhouse: str, allocation: str) -> AWS:
    """An AWS provider whose single instance can only be ``host``."""
    network = ipaddress.ip_interface(f"{host.bridge_ip}/24").network
    subnet = subnet_with_only(aws_env, network, [host.ip])
    return AWS(subnet_id=subnet, ami=aws_env.ami, allocation=allocation,
               user=host.user, ssh_key=host.key_path, known_hosts=host.known_hosts_all,
               ssh_cidr=f"{host.bridge_ip}/32", find_links=[wheelhouse], no_index=True,
               connect_timeout=5, boot_timeout=60)


@pytest.mark.parametrize(("executor", "processes"), [("thread", 2), ("process", 1)])
def test_a_spot_notice_reaches_polling_tasks_on_preempt_callbacks_and_the_client(
        aws, test_hosts, wheelhouse, tmp_path, executor, processes):
    """(With two worker processes on the node, each watches and tells its tasks; the client
    is told once per kind all the same.)"""
    host = test_hosts[0]
    events: list[ev.Event] = []
    marks = [str(tmp_path / "polling"), str(tmp_path / "registered")]
    with imds.in_host(host) as metadata:
        provider = aws_on(aws, host, wheelhouse, "spot")
        with sky.ComputePool(provider=provider, nodes=1, concurrency=2, executor=executor,
                             processes_per_node=processes, console=False, on_event=events.append) as pool:
            polling = wait_for_preempting(marks[0], 60) > pool
            registered = checkpoint_on_preempt(marks[1], 60) > pool
            assert wait_until(lambda: all(os.path.exists(m) for m in marks), timeout=30), "the tasks did not start"
            assert any(r["status"] == 404 for r in metadata.requests), "the spot node's worker is not watching"

            noticed = metadata.rebalance()
            assert wait_until(lambda: any(isinstance(e, ev.NodePreempting) for e in events), timeout=15)
            at = metadata.interrupt("terminate")
            polled = polling.result(timeout=30)
            called = registered.result(timeout=30)
            assert wait_until(lambda: len([e for e in events if isinstance(e, ev.NodePreempting)]) == 2, timeout=15)

    # The polling task saw the rebalance recommendation, then the interruption notice.
    assert polled["kinds"] == ["rebalance", "interruption"]
    assert (polled["action"], polled["at"]) == ("terminate", at)
    # The callback ran once, for the interruption, on a thread of the task's own process.
    assert [(c["kind"], c["at"], c["pid"], c["thread"]) for c in called["calls"]] == [
        ("interruption", at, called["pid"], "skyward-on-preempt")]
    if executor == "process":
        assert called["pid"] != polled["pid"]  # two task processes, each told
    printed = [e for e in events if isinstance(e, ev.TaskOutput) and e.line == "checkpoint saved"]
    assert len(printed) == 1  # the callback's output is its task's
    # The client: one event per kind, in order.
    told = [e for e in events if isinstance(e, ev.NodePreempting)]
    assert told == [ev.NodePreempting(0, None, noticed, "rebalance"), ev.NodePreempting(0, "terminate", at, "interruption")]
    assert wait_until(lambda: not leftovers([host], r"skyward"), timeout=10), leftovers([host])
    stopped = [e for e in events if isinstance(e, ev.PoolStopped)]
    assert stopped and stopped[-1].clean


def test_an_on_demand_node_does_not_watch_for_notices(aws, test_hosts, wheelhouse):
    host = test_hosts[0]
    events: list[ev.Event] = []
    with imds.in_host(host) as metadata:
        metadata.interrupt("terminate")  # there from the start: a watcher could not miss it
        provider = aws_on(aws, host, wheelhouse, "on-demand")
        with sky.ComputePool(provider=provider, nodes=1, console=False, on_event=events.append) as pool:
            assert [i.spot for i in pool.instances] == [False]
            assert preempting_after(3 * POLL_INTERVAL) >> pool is None
        assert metadata.requests == []
    assert not [e for e in events if isinstance(e, ev.NodePreempting)]


def test_a_client_attaching_to_a_spot_cluster_after_its_notice_is_told_too(aws, home, test_hosts, wheelhouse):  # noqa: F811
    host = test_hosts[0]
    cluster = "pre" + uuid.uuid4().hex[:8]
    first: list[ev.Event] = []
    later: list[ev.Event] = []
    with imds.in_host(host) as metadata:
        provider = aws_on(aws, host, wheelhouse, "spot")
        with sky.ComputePool(name=cluster, provider=provider, nodes=1, console=False, on_event=first.append):
            at = metadata.interrupt("terminate")
            assert wait_until(lambda: any(isinstance(e, ev.NodePreempting) for e in first), timeout=15)
        # the notice came while that client was attached; the next one attaches afterwards
        with sky.ComputePool(name=cluster, console=False, on_event=later.append) as pool:
            assert preempting_after(0) >> pool == sky.Preemption("interruption", "terminate", at)
            assert wait_until(lambda: any(isinstance(e, ev.NodePreempting) for e in later), timeout=10)
            pool.down()
    assert [e for e in later if isinstance(e, ev.NodePreempting)] == [
        ev.NodePreempting(0, "terminate", at, "interruption")]
    assert wait_until(lambda: not leftovers([host], r"skyward"), timeout=10), leftovers([host])
