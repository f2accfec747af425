"""Elastic pools on AWS (moto, its instances placed at the SSH test hosts' addresses as in
tests/test_aws_e2e.py): a scale-up is one RunInstances, tagged with the pool; a node released
(idle, or lost) terminates just its instance, the pool's key pair and security group stay;
a lost node is replaced by a new instance; nothing is left at the end (the ``aws`` fixture)."""

from __future__ import annotations

import ipaddress
import os
import signal
import threading

import pytest

import skyward as sky
from skyward import events as ev
from skyward.providers.aws.provider import AWS
from tests.aws_conftest import aws, moto_server  # noqa: F401  (fixtures)
from tests.contract.elastic_tasks import node_and_pid, pause_then
from tests.hosts import testhosts
from tests.test_aws import hooked
from tests.test_aws_e2e import subnet_with_only
from tests.test_ssh import wait_until, wheelhouse  # noqa: F401  (wheelhouse is a fixture)

pytestmark = pytest.mark.skipif(testhosts.unavailable_reason() is not None,
                                reason=str(testhosts.unavailable_reason()))


class Recorder:
    """RunInstances calls (how many instances each asked for) and membership events."""

    def __init__(self) -> None:
        self.launches: list[int] = []
        self.events: list[ev.Event] = []
        self.changed = threading.Condition()

    def on_run_instances(self, params: dict, **_: object) -> None:
        self.launches.append(int(params["body"]["MaxCount"]))

    def on_event(self, event: ev.Event) -> None:
        if isinstance(event, (ev.NodeAdded, ev.NodeRemoved)):
            with self.changed:
                self.events.append(event)
                self.changed.notify_all()

    def wait_for(self, kind: type, count: int, timeout: float = 60.0) -> list:
        with self.changed:
            self.changed.wait_for(lambda: len([e for e in self.events if isinstance(e, kind)]) >= count, timeout)
            return [e for e in self.events if isinstance(e, kind)]


def provider_on_hosts(env, hosts, wheelhouse: str, recorder: Recorder, *hooks: tuple) -> AWS:
    network = ipaddress.ip_interface(f"{hosts[0].bridge_ip}/24").network
    subnet = subnet_with_only(env, network, [h.ip for h in hosts])
    return AWS(subnet_id=subnet, ami=env.ami, allocation="spot-if-available", user=hosts[0].user,
               ssh_key=hosts[0].key_path, known_hosts=hosts[0].known_hosts_all, ssh_cidr=f"{hosts[0].bridge_ip}/32",
               find_links=[wheelhouse], no_index=True, connect_timeout=5, boot_timeout=60,
               session=hooked(("before-call.ec2.RunInstances", recorder.on_run_instances), *hooks))


def states(env, ids: list[str]) -> dict[str, str]:
    return {i["InstanceId"]: i["State"]["Name"] for r in env.client().describe_instances(InstanceIds=ids)[
        "Reservations"] for i in r["Instances"]}


def test_a_scale_up_is_one_run_instances_and_an_idle_node_releases_just_its_instance(aws, test_hosts, wheelhouse):
    recorder = Recorder()
    provider = provider_on_hosts(aws, test_hosts[:2], wheelhouse, recorder)
    with sky.ComputePool(provider=provider, nodes=(1, 2), scale_up_after=0.5, scale_down_after=2.0, console=False,
                         idle_timeout=30, on_event=recorder.on_event) as pool:
        first = pool.instances[0].id
        assert pool.map(lambda i: pause_then.fn(i, 1.0), range(10)) == list(range(10))
        [added] = recorder.wait_for(ev.NodeAdded, 1)
        assert added.node == 1 and recorder.launches == [1, 1]  # the pool's, then one for the scale-up
        second = next(i.id for i in pool.instances if i.node == 1)
        tags = {t["Key"]: t["Value"] for r in aws.client().describe_instances(InstanceIds=[second])["Reservations"]
                for i in r["Instances"] for t in i.get("Tags", [])}
        assert tags["skyward:pool"] == pool.id and tags["skyward:node"] == "1"
        [removed] = recorder.wait_for(ev.NodeRemoved, 1)
        gone = second if removed.node == 1 else first
        kept = first if gone == second else second
        now = states(aws, [first, second])
        assert now[gone] in ("shutting-down", "terminated") and now[kept] == "running"
        groups = aws.client().describe_security_groups(
            Filters=[{"Name": "tag:skyward:pool", "Values": [pool.id]}])["SecurityGroups"]
        assert groups and aws.client().describe_key_pairs(KeyNames=[f"skyward-{pool.id}"])["KeyPairs"]
        assert [n for n, _, _ in node_and_pid() @ pool] == [1 - removed.node]
    assert set(states(aws, [first, second]).values()) <= {"shutting-down", "terminated"}


def test_a_lost_node_is_replaced_by_a_new_instance(aws, test_hosts, wheelhouse):
    recorder = Recorder()
    provider = provider_on_hosts(aws, test_hosts[:2], wheelhouse, recorder)
    with sky.ComputePool(provider=provider, nodes=(1, 1), console=False, idle_timeout=30,
                         on_event=recorder.on_event) as pool:
        old = pool.instances[0].id
        [(_, _, pid)] = node_and_pid() @ pool
        os.kill(pid, signal.SIGKILL)
        recorder.wait_for(ev.NodeAdded, 1)
        pool.wait_ready(timeout=60)
        [(node, total, new_pid)] = node_and_pid() @ pool
        new = pool.instances[0].id
        assert (node, total) == (0, 1) and new_pid != pid and new != old
        assert states(aws, [old])[old] in ("shutting-down", "terminated")
        assert recorder.launches == [1, 1]
    assert wait_until(lambda: states(aws, [new])[new] in ("shutting-down", "terminated"), 10)


def test_a_replacement_that_cannot_launch_fails_the_pool_and_leaves_nothing(aws, test_hosts, wheelhouse):
    """The cloud answers the replacement's RunInstances with garbage (as moto once did under
    load): the pool names the failure, and its close still deletes the pool's key pair and
    security group (the ``aws`` fixture counts them)."""
    from botocore.parsers import ResponseParserError

    broken = threading.Event()

    def garbage(**_: object) -> None:
        if broken.is_set():
            raise ResponseParserError("Unable to parse response: <!doctype html> 500 Internal Server Error")

    recorder = Recorder()
    provider = provider_on_hosts(aws, test_hosts[:1], wheelhouse, recorder, ("before-call.ec2.RunInstances", garbage))
    with pytest.raises(sky.SkywardError, match="could not be replaced"):
        with sky.ComputePool(provider=provider, nodes=(1, 1), console=False, idle_timeout=30,
                             on_event=recorder.on_event) as pool:
            [(_, _, pid)] = node_and_pid() @ pool
            broken.set()
            os.kill(pid, signal.SIGKILL)
            node_and_pid() @ pool
    assert recorder.launches == [1, 1, 1, 1]  # the pool's, then three tries at a replacement


def test_a_scale_up_falls_back_to_on_demand_as_the_first_launch_would(aws):
    from tests.test_aws import describe, provider, refuse, spec

    calls: list[dict] = []
    spot_refused = [False]
    session = hooked(("before-call.ec2.RunInstances",
                      refuse("InsufficientInstanceCapacity", "There is no Spot capacity available",
                             when=lambda body: spot_refused[0] and body.get(
                                 "InstanceMarketOptions.MarketType") == "spot", calls=calls)))
    p = provider(aws, session=session, allocation="spot-if-available")
    s = spec(1)
    first = p.provision(s)
    try:
        spot_refused[0] = True  # the market changed since the pool started
        [more] = p.acquire(s, [3], frozenset(i.id for i in first))
        assert more.node == 3 and more.id != first[0].id
        markets = [c["market"] for c in calls]
        assert markets[0] == "spot" and markets[-1] == "on-demand" and "spot" in markets[1:-1]
        [item] = describe(aws, [more.id])
        assert "InstanceLifecycle" not in item
        assert {t["Key"]: t["Value"] for t in item["Tags"]}["skyward:node"] == "3"
        p.release([more])  # just that instance
        assert describe(aws, [more.id])[0]["State"]["Name"] in ("shutting-down", "terminated")
        assert describe(aws, [first[0].id])[0]["State"]["Name"] == "running"
        assert aws.client().describe_security_groups(
            Filters=[{"Name": "tag:skyward:pool", "Values": [s.pool_id]}])["SecurityGroups"]
    finally:
        p.terminate(first)
