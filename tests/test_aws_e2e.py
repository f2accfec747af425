"""End to end: a pool on EC2 (moto) whose instances are real SSH test hosts.

The instances moto reports must be machines Skyward can reach. The test hosts of
tests/hosts/testhosts.py are real sshd hosts, each in its own network namespace at
``.11``, ``.12``, ... of a /24 bridge subnet. So the test creates, in moto, a VPC and a subnet
whose CIDR *is* the bridge's subnet, and reserves every address of it except the hosts'
(EC2 subnet CIDR reservations of type ``explicit``: EC2 never assigns those addresses by
itself). EC2 is left no choice but to give the instances exactly the hosts' addresses —
Skyward's code, the instance addresses and the hosts are all unchanged and real; only the
addresses free in the subnet are arranged, as a network admin could. The check that the
instances did land there is part of the test.

Then the flow a user gets: launch (security group, key pair, instances) -> SSH to the
private addresses (the harness's login key and known_hosts, passed through ``AWS``'s public
``ssh_key=``/``known_hosts=``/``user=`` parameters) -> bootstrap through the SSH provider's
code path -> tasks with ``@`` and ``>>`` -> teardown. Afterwards: no worker on any host and no
skyward-tagged resource in moto (the ``aws`` fixture).
"""

from __future__ import annotations

import ipaddress
import socket

import pytest

import skyward as sky
from skyward import events as ev
from skyward.providers.aws.provider import AWS
from tests.aws_conftest import aws, moto_server  # noqa: F401  (fixtures)
from tests.hosts import testhosts
from tests.test_ssh import leftovers, wait_until, wheelhouse  # noqa: F401  (wheelhouse is a fixture)

pytestmark = pytest.mark.skipif(testhosts.unavailable_reason() is not None,
                                reason=str(testhosts.unavailable_reason()))


@sky.compute
def whereabouts() -> dict:
    info = sky.instance_info()
    return {"host": socket.gethostname(), "node": info.node, "head": info.head_addr,
            "peers": [p.addr for p in info.peers]}


@sky.compute
def add(a: int, b: int) -> int:
    return a + b


def subnet_with_only(env, network: ipaddress.IPv4Network, addresses: list[str]) -> str:
    """A moto subnet over ``network`` where EC2 may assign nothing but ``addresses``."""
    ec2 = env.client()
    vpc = ec2.create_vpc(CidrBlock=str(network))["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock=str(network), AvailabilityZone="us-east-1a")["Subnet"]["SubnetId"]
    blocks = [network]
    for address in addresses:
        keep = ipaddress.ip_network(f"{address}/32")
        blocks = [b for block in blocks for b in (block.address_exclude(keep) if keep.subnet_of(block) else [block])]
    for block in blocks:
        ec2.create_subnet_cidr_reservation(SubnetId=subnet, Cidr=str(block), ReservationType="explicit")
    return subnet


def test_an_aws_pool_launches_reaches_bootstraps_runs_and_leaves_nothing(aws, test_hosts, wheelhouse):
    hosts = test_hosts[:2]
    network = ipaddress.ip_interface(f"{hosts[0].bridge_ip}/24").network
    assert all(ipaddress.ip_address(h.ip) in network for h in hosts)
    subnet = subnet_with_only(aws, network, [h.ip for h in hosts])

    provider = AWS(
        subnet_id=subnet, ami=aws.ami, allocation="spot-if-available",
        user=hosts[0].user, ssh_key=hosts[0].key_path, known_hosts=hosts[0].known_hosts_all,
        ssh_cidr=f"{hosts[0].bridge_ip}/32",  # where this client's connections come from
        find_links=[wheelhouse], no_index=True, connect_timeout=5, boot_timeout=60,
    )
    events: list[ev.Event] = []
    with sky.ComputePool(provider=provider, nodes=2, console=False, on_event=events.append) as pool:
        instances = pool.instances
        described = {i["InstanceId"]: i for r in aws.client().describe_instances(
            InstanceIds=[i.id for i in instances])["Reservations"] for i in r["Instances"]}
        # EC2 placed the instances at the hosts' addresses, in our subnet, as spot.
        assert sorted(i["PrivateIpAddress"] for i in described.values()) == sorted(h.ip for h in hosts)
        assert {i["SubnetId"] for i in described.values()} == {subnet}
        assert {i.get("InstanceLifecycle") for i in described.values()} == {"spot"}
        addrs = [i.private_addr for i in instances]

        everyone = whereabouts() @ pool
        assert [r["node"] for r in everyone] == [0, 1]
        by_ip = {h.ip: h.name for h in hosts}
        assert [r["host"] for r in everyone] == [by_ip[a] for a in addrs]  # node N runs on its instance
        assert {r["head"] for r in everyone} == {addrs[0]}
        assert all(r["peers"] == addrs for r in everyone)
        one = whereabouts() >> pool
        assert one["host"] in by_ip.values()
        assert add(2, 3) >> pool == 5
        assert leftovers(hosts, r"skyward\.worker"), "the workers should be running on the hosts"

    assert wait_until(lambda: not leftovers(hosts, r"skyward\.worker"), timeout=10), leftovers(hosts)
    stopped = [e for e in events if isinstance(e, ev.PoolStopped)]
    assert stopped and stopped[-1].clean
    states = {i["State"]["Name"] for r in aws.client().describe_instances(
        InstanceIds=[i.id for i in instances])["Reservations"] for i in r["Instances"]}
    assert states <= {"shutting-down", "terminated"}
