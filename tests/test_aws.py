"""The AWS provider against moto's EC2 server (a real HTTP endpoint on loopback).

boto3 reaches the server through configuration only (see tests/aws_conftest.py); AWS's own
refusals (capacity, quota, permissions) are injected at the boto3 boundary with botocore
event hooks on a ``boto3.Session`` handed to ``sky``'s public ``session=`` parameter. After
every test using ``aws``, no skyward-tagged instance, key pair or security group may be left.
"""

from __future__ import annotations

import base64
import http.server
import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import skyward as sky
from skyward.accelerators import A100, parse_accelerator
from skyward.errors import CapacityError, ConfigError, ProvisionError
from skyward.providers.aws import ec2 as api
from skyward.providers.aws import inventory
from skyward.providers.aws import watchdog
from skyward.providers.aws.provider import AWS, DLAMI_PARAMETER, UBUNTU_PARAMETER
from skyward.providers.base import PoolSpec
from skyward.testing import aws_bookkeeping
from tests.aws_conftest import aws, moto_server  # noqa: F401  (fixtures)

CLIENT_CIDR = "198.51.100.7/32"


# -- helpers -----------------------------------------------------------------------------------------


def spec(nodes: int = 2, accelerator: Any = None) -> PoolSpec:
    return PoolSpec(uuid.uuid4().hex[:8], nodes, parse_accelerator(accelerator))


def provider(env, **options) -> AWS:
    options.setdefault("ami", env.ami)
    options.setdefault("ssh_cidr", CLIENT_CIDR)
    return AWS(**options)


def client_error(code: str, message: str, operation: str) -> Exception:
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": code, "Message": message}}, operation)


def hooked(*hooks: tuple[str, Callable[..., Any]]) -> Any:
    """A boto3 session whose clients run ``hooks`` (botocore event name, handler)."""
    import boto3

    session = boto3.Session()
    for event, handler in hooks:
        session.events.register(event, handler)
    return session


def refuse(code: str, message: str, *, when: Callable[[dict], bool] = lambda body: True,
           calls: list | None = None) -> Callable[..., None]:
    """A ``before-call.ec2.RunInstances`` handler answering like AWS when ``when(body)``."""

    def handler(params: dict, **_: Any) -> None:
        body = params["body"]
        if calls is not None:
            calls.append({"market": body.get("InstanceMarketOptions.MarketType", "on-demand"),
                          "type": body.get("InstanceType"), "subnet": body.get("SubnetId")})
        if when(body):
            raise client_error(code, message, "RunInstances")

    return handler


def is_spot(body: dict) -> bool:
    return body.get("InstanceMarketOptions.MarketType") == "spot"


def describe(env, ids: list[str]) -> list[dict]:
    reservations = env.client().describe_instances(InstanceIds=ids)["Reservations"]
    return [i for r in reservations for i in r["Instances"]]


def tags(item: dict) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in item.get("Tags", [])}


# -- input is checked before anything is launched ------------------------------------------------------


@pytest.mark.parametrize(("options", "parameter"), [
    ({"allocation": "cheap"}, "allocation"),
    ({"region": "mars-1"}, "region"),
    ({"ami": "ubuntu"}, "ami"),
    ({"subnet_id": "sn-1"}, "subnet_id"),
    ({"instance_type": "huge"}, "instance_type"),
    ({"vcpus": 0}, "vcpus"),
    ({"memory_gb": -1}, "memory_gb"),
    ({"arch": "sparc"}, "arch"),
    ({"idle_timeout": 5}, "idle_timeout"),
    ({"idle_timeout": 3600, "max_lifetime": 600}, "max_lifetime"),
    ({"ssh_cidr": "not-an-address"}, "ssh_cidr"),
    ({"ssh_key": "/nonexistent/key"}, "ssh_key"),
    ({"known_hosts": "/nonexistent/known_hosts"}, "known_hosts"),
    ({"user": "root@host"}, "user"),
    ({"disk_gb": 1}, "disk_gb"),
    ({"ssh_via": "carrier-pigeon"}, "ssh_via"),
    ({"public_ip": "yes"}, "public_ip"),
    ({"root": 3}, "root"),
    ({"root": "relative/dir"}, "root"),
    ({"no_index": "yes"}, "no_index"),
    ({"find_links": "/srv/wheels"}, "find_links"),  # a lone string would be split into characters
    ({"find_links": ["/srv/wheels", 3]}, "find_links[1]"),
    ({"idle_timeout": float("inf")}, "idle_timeout"),
    ({"max_lifetime": float("nan")}, "max_lifetime"),
    ({"vcpus": True}, "vcpus"),
    ({"session": object(), "profile": "dev"}, "session"),
    ({"known_hosts": []}, "known_hosts"),
])
def test_bad_parameters_are_rejected_naming_the_parameter(options, parameter):
    with pytest.raises(ConfigError) as info:
        AWS(**options)
    assert info.value.parameter == parameter


def test_a_lone_find_links_string_says_to_pass_a_list():
    with pytest.raises(ConfigError) as info:
        AWS(find_links="/srv/wheels")
    assert "pass a list" in info.value.detail


def test_options_keep_their_values():
    aws = AWS(region="us-east-1", find_links=["/srv/wheels"], idle_timeout=120, disk_gb=50, ssh_cidr="10.0.0.7")
    assert (aws.find_links, aws.idle_timeout, aws.disk_gb, aws.ssh_cidr) == (("/srv/wheels",), 120.0, 50, "10.0.0.7/32")


def test_importing_the_provider_package_loads_no_aws_sdk():
    code = ("import sys, skyward, skyward.providers.aws.provider, skyward.providers.aws.ec2, skyward.cli\n"
            "print(','.join(m for m in ('boto3', 'botocore', 'paramiko') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


# -- plan: exact requests, offline ------------------------------------------------------------------------


def _run_request(**overrides) -> dict:
    options = dict(pool_id="p1", count=3, instance_type="g5.xlarge", image_id="ami-0123456789abcdef0",
                   subnet_id="subnet-1", group_id="sg-1", key_name="skyward-p1", market="spot",
                   user_data="#cloud-config\n{}", client_token="tok", created="2025-01-01T00:00:00Z")
    options.update(overrides)
    return api.run_instances_request(**options)


def test_spot_request_launches_all_nodes_or_none_and_terminates_on_shutdown():
    r = _run_request()
    assert (r["MinCount"], r["MaxCount"]) == (3, 3)
    assert r["InstanceInitiatedShutdownBehavior"] == "terminate"
    assert r["InstanceMarketOptions"] == {"MarketType": "spot", "SpotOptions": {
        "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}}
    assert (r["SubnetId"], r["SecurityGroupIds"], r["KeyName"]) == ("subnet-1", ["sg-1"], "skyward-p1")
    assert r["MetadataOptions"]["HttpTokens"] == "required"
    by_type = {s["ResourceType"]: {t["Key"]: t["Value"] for t in s["Tags"]} for s in r["TagSpecifications"]}
    assert by_type["instance"]["skyward:pool"] == "p1" and by_type["volume"]["skyward:pool"] == "p1"
    assert by_type["instance"]["skyward:created"] == "2025-01-01T00:00:00Z"


def test_on_demand_request_has_no_market_options_and_public_ip_goes_through_the_interface():
    r = _run_request(market="on-demand", public_ip=True, root_device="/dev/sda1", disk_gb=120)
    assert "InstanceMarketOptions" not in r
    assert "SubnetId" not in r and "SecurityGroupIds" not in r
    assert r["NetworkInterfaces"] == [{"DeviceIndex": 0, "SubnetId": "subnet-1", "Groups": ["sg-1"],
                                       "AssociatePublicIpAddress": True, "DeleteOnTermination": True}]
    assert r["BlockDeviceMappings"][0]["Ebs"] == {"VolumeSize": 120, "VolumeType": "gp3",
                                                  "DeleteOnTermination": True, "Encrypted": True}


def test_ingress_allows_ssh_from_the_client_only_and_everything_within_the_group():
    r = api.ingress_request("sg-9", "203.0.113.7/32")
    ssh, members = r["IpPermissions"]
    assert (ssh["IpProtocol"], ssh["FromPort"], ssh["ToPort"]) == ("tcp", 22, 22)
    assert [x["CidrIp"] for x in ssh["IpRanges"]] == ["203.0.113.7/32"]
    assert members["IpProtocol"] == "-1" and members["UserIdGroupPairs"][0]["GroupId"] == "sg-9"
    assert "IpRanges" not in members


def test_capacity_and_quota_refusals_translate_to_capacity_error_others_to_provision_error():
    from botocore.exceptions import NoCredentialsError

    capacity = api.translate(client_error("InsufficientInstanceCapacity", "no g5 today", "RunInstances"),
                             "RunInstances", instance_type="g5.xlarge", zone="us-east-1a")
    assert type(capacity) is CapacityError
    assert "no g5 today" in str(capacity) and "g5.xlarge" in str(capacity) and "us-east-1a" in str(capacity)
    quota = api.translate(client_error("VcpuLimitExceeded", "limit 0", "RunInstances"), "RunInstances")
    assert type(quota) is CapacityError and "quota" in str(quota)
    denied = api.translate(client_error("UnauthorizedOperation", "nope", "RunInstances"), "RunInstances")
    assert type(denied) is ProvisionError
    creds = api.translate(NoCredentialsError(), "DescribeVpcs")
    assert isinstance(creds, ConfigError) and creds.parameter == "credentials"


# -- the watchdog ------------------------------------------------------------------------------------------


def test_watchdog_script_is_valid_bash_with_its_limits():
    script = watchdog.watchdog_script(idle_timeout=600, max_lifetime=7200)
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    assert "IDLE=600" in script and "LIFETIME=7200" in script
    assert "shutdown -h now" in script and ":0016" in script  # port 22 in /proc/net/tcp


def test_user_data_installs_the_watchdog_arms_max_lifetime_and_sets_the_host_key():
    key = watchdog.HostKey("ed25519", "ssh-ed25519 AAAAPUBLIC", "-----BEGIN OPENSSH PRIVATE KEY-----\nx\n")
    text = watchdog.user_data(idle_timeout=900, max_lifetime=3 * 3600, host_key=key)
    header, body = text.split("\n", 1)
    assert header == "#cloud-config"
    config = json.loads(body)
    yaml = pytest.importorskip("yaml")
    assert yaml.safe_load(body) == config  # what cloud-init parses
    assert config["bootcmd"] == [["shutdown", "-h", "+180", "skyward: max_lifetime reached"]]
    assert config["ssh_keys"] == {"ed25519_private": key.private, "ed25519_public": key.public}
    files = {f["path"]: f for f in config["write_files"]}
    script = files["/usr/local/sbin/skyward-watchdog"]
    assert script["permissions"] == "0755" and "IDLE=900" in script["content"]
    assert "ClientAliveInterval" in files["/etc/ssh/sshd_config.d/60-skyward-keepalive.conf"]["content"]
    assert ["systemctl", "enable", "--now", watchdog.SERVICE_NAME] in config["runcmd"]
    assert key.private not in repr(key)


@pytest.fixture
def fake_shutdown(tmp_path) -> Iterator[tuple[dict[str, str], str]]:
    """A PATH whose ``shutdown`` records its arguments instead of powering off."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    record = tmp_path / "shutdown.args"
    (bindir / "shutdown").write_text(f'#!/bin/sh\necho "$@" >> {record}\n')
    (bindir / "shutdown").chmod(0o755)
    yield {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}, str(record)


def _run_watchdog(tmp_path, env, **options) -> subprocess.Popen:
    script = watchdog.watchdog_script(heartbeat=str(tmp_path / "hb"), interval=0.1, **options)
    path = tmp_path / "watchdog.sh"
    path.write_text(script)
    return subprocess.Popen(["bash", str(path)], env=env, stdout=subprocess.PIPE, text=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_watchdog_powers_off_after_idle_timeout_but_not_while_ssh_is_connected(tmp_path, fake_shutdown):
    env, record = fake_shutdown
    port = _free_port()
    server = socket.create_server(("127.0.0.1", port))
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = server.accept()  # an established connection to the "SSH" port
    proc = _run_watchdog(tmp_path, env, idle_timeout=1, max_lifetime=None, ssh_port=port)
    try:
        time.sleep(2.5)
        assert proc.poll() is None and not os.path.exists(record), "powered off while connected"
        client.close()
        conn.close()
        proc.wait(timeout=10)
    finally:
        proc.kill()
        server.close()
    assert open(record).read().split() == ["-h", "now"]
    assert "no heartbeat" in proc.stdout.read()


def test_watchdog_powers_off_at_max_lifetime_whatever_the_heartbeat(tmp_path, fake_shutdown):
    env, record = fake_shutdown
    # This machine has been up for more than a second: the lifetime is already over.
    proc = _run_watchdog(tmp_path, env, idle_timeout=3600, max_lifetime=1)
    try:
        proc.wait(timeout=10)
    finally:
        proc.kill()
    assert open(record).read().split() == ["-h", "now"]
    assert "max_lifetime" in proc.stdout.read()


# -- instance types and AMIs ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("accelerator", "expected"), [
    ("A100", "p4d.24xlarge"),
    ("H100:8", "p5.48xlarge"),
    ("L4:4", "g6.12xlarge"),
    ("T4", "g4dn.xlarge"),
    ("A100-80GB:8", "p4de.24xlarge"),
    (A100(count=8, memory="80GB"), "p4de.24xlarge"),
])
def test_the_cheapest_instance_type_with_the_accelerator_is_chosen(aws, accelerator, expected):
    plan = provider(aws).plan(spec(1, accelerator))
    assert plan.candidates[0].name == expected and plan.types_source == "ec2-api"
    assert plan.candidates[0].cuda and plan.markets == ("spot", "on-demand")


@pytest.mark.parametrize(("options", "expected"), [
    ({}, "t3.medium"),
    ({"vcpus": 8}, "c7i.2xlarge"),
    ({"vcpus": 8, "memory_gb": 64}, "r7i.2xlarge"),
])
def test_cpu_pools_choose_the_cheapest_type_with_enough_vcpus_and_memory(aws, options, expected):
    plan = provider(aws, **options).plan(spec(2))
    assert plan.candidates[0].name == expected and plan.candidates[0].gpu is None


def test_the_bundled_catalog_stands_in_when_describe_instance_types_is_denied(aws, monkeypatch):
    def deny(**_: Any) -> None:
        raise client_error("UnauthorizedOperation", "not allowed", "DescribeInstanceTypes")

    # Another region than the other tests: the EC2 answer is cached per region and endpoint.
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    images = aws.client(region="eu-west-1").describe_images(Owners=["amazon"])["Images"]
    p = AWS(ami=sorted(i["ImageId"] for i in images)[0], ssh_cidr=CLIENT_CIDR,
            session=hooked(("before-call.ec2.DescribeInstanceTypes", deny)))
    plan = p.plan(spec(1, "L4"))
    assert plan.region == "eu-west-1"
    assert plan.types_source.startswith("catalog") and plan.candidates[0].name == "g6.xlarge"


def test_requests_no_region_can_serve_fail_before_launch(aws):
    with pytest.raises(ConfigError) as info:
        sky.ComputePool(provider=provider(aws), accelerator="T4:16", console=False)
    assert info.value.parameter == "accelerator" and "T4" in str(info.value)
    with pytest.raises(ConfigError) as info:
        sky.ComputePool(provider=provider(aws, instance_type="g5.xlarge"), accelerator="A100", console=False)
    assert info.value.parameter == "accelerator"
    with pytest.raises(ConfigError) as info:
        sky.ComputePool(provider=provider(aws, instance_type="zz9.huge"), console=False)
    assert info.value.parameter == "instance_type"
    with pytest.raises(ConfigError) as info:
        sky.ComputePool(provider=provider(aws, subnet_id="subnet-0123456789abcdef0"), console=False)
    assert info.value.parameter == "subnet_id"


def test_missing_credentials_are_a_config_error_before_anything_is_launched(aws, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(ConfigError) as info:
        sky.ComputePool(provider=provider(aws), console=False)
    assert info.value.parameter == "credentials"


def _public_parameters(answers: dict[str, str], asked: list[str]) -> Callable[..., Any]:
    """Stand in for AWS's public SSM parameters (``/aws/service/...``, which moto refuses to hold)."""
    from botocore.awsrequest import AWSResponse

    def handler(params: dict, **_: Any) -> Any:
        name = json.loads(params["body"])["Name"]
        asked.append(name)
        if name in answers:
            return AWSResponse("", 200, {}, None), {"Parameter": {"Name": name, "Type": "String",
                                                                  "Value": answers[name]}}
        return None

    return handler


def test_default_amis_come_from_the_dlami_and_ubuntu_public_parameters(aws):
    dlami = DLAMI_PARAMETER.format(arch="x86_64")
    ubuntu = UBUNTU_PARAMETER.format(arch="amd64")
    images = sorted(i["ImageId"] for i in aws.client().describe_images(Owners=["amazon"])["Images"])
    asked: list[str] = []
    session = hooked(("before-call.ssm.GetParameter",
                      _public_parameters({dlami: images[0], ubuntu: images[1]}, asked)))
    gpu = AWS(ssh_cidr=CLIENT_CIDR, session=session).plan(spec(1, "T4"))
    cpu = AWS(ssh_cidr=CLIENT_CIDR, session=session).plan(spec(1))
    assert asked == [dlami, ubuntu]
    assert gpu.image_for(gpu.candidates[0]).image_id == images[0]
    assert cpu.image_for(cpu.candidates[0]).image_id == images[1]


def test_ami_may_name_an_ssm_parameter_and_an_unknown_ami_is_a_config_error(aws):
    ssm = aws.client("ssm")
    ssm.put_parameter(Name="/team/golden-ami", Value=aws.ami, Type="String")
    plan = AWS(ami="resolve:ssm:/team/golden-ami", ssh_cidr=CLIENT_CIDR).plan(spec(1))
    image = plan.image_for(plan.candidates[0])
    assert image.image_id == aws.ami and image.source == "ssm:/team/golden-ami"
    with pytest.raises(ConfigError) as info:
        AWS(ami="ami-0000000000000dead", ssh_cidr=CLIENT_CIDR).plan(spec(1))
    assert info.value.parameter == "ami"


# -- launching and releasing ----------------------------------------------------------------------------------


def test_a_spot_pool_is_launched_in_one_zone_tagged_and_released_completely(aws):
    p = provider(aws, allocation="spot")
    s = spec(3, "T4")
    p.validate(s)
    instances = p.provision(s)
    try:
        assert [i.node for i in instances] == [0, 1, 2]
        described = {i["InstanceId"]: i for i in describe(aws, [i.id for i in instances])}
        for inst in instances:
            item = described[inst.id]
            assert item["InstanceType"] == "g4dn.xlarge" and item.get("InstanceLifecycle") == "spot"
            assert inst.private_addr == item["PrivateIpAddress"] and inst.accelerators == 1
            assert tags(item)["skyward:pool"] == s.pool_id and tags(item)["skyward:node"] == str(inst.node)
            attr = aws.client().describe_instance_attribute(InstanceId=inst.id,
                                                            Attribute="instanceInitiatedShutdownBehavior")
            assert attr["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
        assert len({i["Placement"]["AvailabilityZone"] for i in described.values()}) == 1
        user_data = aws.client().describe_instance_attribute(InstanceId=instances[0].id, Attribute="userData")
        text = base64.b64decode(user_data["UserData"]["Value"]).decode()
        assert text.startswith("#cloud-config") and "skyward-watchdog" in text

        pool = aws_bookkeeping(p).pools[s.pool_id]
        assert stat.S_IMODE(os.stat(pool.directory).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(pool.key_path).st_mode) == 0o600
        key_pairs = aws.client().describe_key_pairs(KeyNames=[f"skyward-{s.pool_id}"])["KeyPairs"]
        assert tags(key_pairs[0])["skyward:pool"] == s.pool_id
        group = aws.client().describe_security_groups(
            Filters=[{"Name": "tag:skyward:pool", "Values": [s.pool_id]}])["SecurityGroups"][0]
        ssh = [r for r in group["IpPermissions"] if r["IpProtocol"] == "tcp"]
        assert [(r["FromPort"], [x["CidrIp"] for x in r["IpRanges"]]) for r in ssh] == [(22, [CLIENT_CIDR])]
        everything = [r for r in group["IpPermissions"] if r["IpProtocol"] == "-1"]
        assert everything[0]["UserIdGroupPairs"][0]["GroupId"] == group["GroupId"]
        assert not everything[0]["IpRanges"]
        assert all(i["SecurityGroups"][0]["GroupId"] == group["GroupId"] for i in described.values())
    finally:
        p.terminate(instances)
    states = {i["State"]["Name"] for i in describe(aws, [i.id for i in instances])}
    assert states <= {"shutting-down", "terminated"}
    assert not os.path.exists(pool.directory)


def test_root_volumes_are_encrypted_explicitly(aws):
    p = provider(aws, allocation="on-demand")
    s = spec(1)
    instances = p.provision(s)
    try:
        item = describe(aws, [instances[0].id])[0]
        volume_ids = [m["Ebs"]["VolumeId"] for m in item["BlockDeviceMappings"]
                      if m["DeviceName"] == item["RootDeviceName"]]
        volumes = aws.client().describe_volumes(VolumeIds=volume_ids)["Volumes"]
        assert [v["Encrypted"] for v in volumes] == [True]
    finally:
        p.terminate(instances)


def test_ssh_from_every_address_needs_the_explicit_flag(aws):
    with pytest.raises(ConfigError) as info:
        AWS(ami=aws.ami, ssh_cidr="0.0.0.0/0")
    assert info.value.parameter == "ssh_cidr" and "allow_ssh_from_anywhere=True" in str(info.value)
    p = AWS(ami=aws.ami, ssh_cidr="0.0.0.0/0", allow_ssh_from_anywhere=True, allocation="on-demand")
    s = spec(1)
    instances = p.provision(s)
    try:
        group = aws.client().describe_security_groups(
            Filters=[{"Name": "tag:skyward:pool", "Values": [s.pool_id]}])["SecurityGroups"][0]
        ssh = [r for r in group["IpPermissions"] if r["IpProtocol"] == "tcp"]
        assert [x["CidrIp"] for x in ssh[0]["IpRanges"]] == ["0.0.0.0/0"]
    finally:
        p.terminate(instances)


def test_on_demand_pools_launch_without_spot(aws):
    calls: list[dict] = []
    p = provider(aws, allocation="on-demand", session=hooked(("before-call.ec2.RunInstances",
                                                              refuse("x", "y", when=lambda b: False, calls=calls))))
    s = spec(2)
    instances = p.provision(s)
    try:
        assert [c["market"] for c in calls] == ["on-demand"]
        assert all("InstanceLifecycle" not in i for i in describe(aws, [i.id for i in instances]))
    finally:
        p.terminate(instances)


def test_spot_if_available_falls_back_to_on_demand_when_spot_capacity_is_refused(aws):
    calls: list[dict] = []
    session = hooked(("before-call.ec2.RunInstances",
                      refuse("InsufficientInstanceCapacity", "There is no Spot capacity available", when=is_spot,
                             calls=calls)))
    p = provider(aws, session=session)
    s = spec(2, "L4")
    instances = p.provision(s)
    try:
        markets = [c["market"] for c in calls]
        assert markets[-1] == "on-demand" and set(markets[:-1]) == {"spot"} and len(markets) > 2
        assert {c["type"] for c in calls} == {"g6.xlarge"}  # every AZ for spot, then on-demand
        assert all("InstanceLifecycle" not in i for i in describe(aws, [i.id for i in instances]))
        assert aws_bookkeeping(p).pools[s.pool_id].summary.startswith("on-demand g6.xlarge")
    finally:
        p.terminate(instances)


def test_spot_if_available_also_falls_back_when_the_spot_quota_is_reached(aws):
    session = hooked(("before-call.ec2.RunInstances",
                      refuse("MaxSpotInstanceCountExceeded", "Max spot instance count exceeded", when=is_spot)))
    p = provider(aws, session=session)
    instances = p.provision(spec(1))
    try:
        assert "InstanceLifecycle" not in describe(aws, [instances[0].id])[0]
    finally:
        p.terminate(instances)


def test_strict_spot_raises_capacity_error_with_type_zone_and_aws_message(aws):
    session = hooked(("before-call.ec2.RunInstances",
                      refuse("InsufficientInstanceCapacity", "We currently do not have sufficient g5.xlarge capacity")))
    p = provider(aws, allocation="spot", instance_type="g5.xlarge", session=session)
    with pytest.raises(CapacityError) as info:
        p.provision(spec(2))
    error = info.value
    assert error.instance_type == "g5.xlarge" and error.zone.startswith("us-east-1")
    assert "We currently do not have sufficient g5.xlarge capacity" in str(error)
    assert "on-demand" not in str(error).split("answered:")[1]


def test_strict_on_demand_quota_refusal_raises_capacity_error_saying_what_to_do(aws):
    session = hooked(("before-call.ec2.RunInstances",
                      refuse("VcpuLimitExceeded", "You have requested more vCPU capacity than your current vCPU limit")))
    with pytest.raises(CapacityError) as info:
        provider(aws, allocation="on-demand", session=session).provision(spec(1, "A10G"))
    assert "vCPU limit" in str(info.value) and "quota" in str(info.value)


def test_a_zone_without_capacity_moves_the_whole_pool_to_another_zone(aws):
    calls: list[dict] = []
    first_zone: list[str] = []

    def no_capacity_in_first_subnet(body: dict) -> bool:
        first_zone[:] = first_zone or [body["SubnetId"]]
        return body["SubnetId"] == first_zone[0]

    session = hooked(("before-call.ec2.RunInstances",
                      refuse("InsufficientInstanceCapacity", "none here", when=no_capacity_in_first_subnet, calls=calls)))
    p = provider(aws, allocation="on-demand", session=session)
    instances = p.provision(spec(3))
    try:
        zones = {i["Placement"]["AvailabilityZone"] for i in describe(aws, [i.id for i in instances])}
        assert len(zones) == 1 and len(calls) == 2 and calls[0]["subnet"] != calls[1]["subnet"]
    finally:
        p.terminate(instances)


def test_other_aws_errors_become_provision_errors_and_leave_nothing(aws):
    session = hooked(("before-call.ec2.RunInstances",
                      refuse("UnauthorizedOperation", "You are not authorized to perform this operation.")))
    with pytest.raises(ProvisionError) as info:
        provider(aws, session=session).provision(spec(1))
    assert not isinstance(info.value, CapacityError)
    assert "not authorized" in str(info.value) and "IAM" in str(info.value)
    assert type(info.value.__cause__).__module__.startswith("botocore")


def test_translated_aws_errors_name_the_region(aws):
    session = hooked(("before-call.ec2.RunInstances", refuse("InternalError", "An internal error has occurred")))
    with pytest.raises(ProvisionError) as info:
        provider(aws, session=session, allocation="on-demand").provision(spec(1))
    assert f"run_instances in {aws.region} refused: InternalError" in str(info.value)


def test_an_api_error_halfway_through_provisioning_leaves_nothing(aws):
    def fail(**_: Any) -> None:
        raise client_error("InternalError", "An internal error has occurred", "CreateTags")

    # Instances are running when tagging them with their node fails.
    with pytest.raises(ProvisionError, match="internal error"):
        provider(aws, session=hooked(("before-call.ec2.CreateTags", fail))).provision(spec(2))


def test_an_incomplete_launch_answer_is_retried_and_the_missing_instance_terminated(aws):
    dropped: list[str] = []

    def drop_one_the_first_time(parsed: dict, **_: Any) -> None:
        if not dropped:
            dropped.append(parsed["Instances"].pop()["InstanceId"])

    p = provider(aws, allocation="on-demand", session=hooked(("after-call.ec2.RunInstances", drop_one_the_first_time)))
    instances = p.provision(spec(2))
    try:
        assert dropped and dropped[0] not in {i.id for i in instances}
        assert describe(aws, dropped)[0]["State"]["Name"] in ("shutting-down", "terminated")
    finally:
        p.terminate(instances)


def test_ctrl_c_while_the_launch_answer_is_in_flight_leaves_nothing(aws):
    # AWS created the instances, but the client never saw the answer: only their tags find them.
    def interrupt(**_: Any) -> None:
        raise KeyboardInterrupt

    p = provider(aws, session=hooked(("after-call.ec2.RunInstances", interrupt)))
    p.cleanup_settle = 0.2
    with pytest.raises(KeyboardInterrupt):
        with sky.ComputePool(provider=p, nodes=2, console=False):
            pass
    assert not aws_bookkeeping(p).pools


def test_ctrl_c_while_waiting_for_instances_to_run_leaves_nothing(aws):
    interrupted: list[bool] = []

    def interrupt_once(params: dict, **_: Any) -> None:
        if not interrupted and "InstanceId.1" in params["body"]:  # the wait for "running"
            interrupted.append(True)
            raise KeyboardInterrupt

    p = provider(aws, session=hooked(("before-call.ec2.DescribeInstances", interrupt_once)))
    with pytest.raises(KeyboardInterrupt):
        p.provision(spec(2))
    assert interrupted


def test_ssh_cidr_defaults_to_the_address_the_lookup_url_reports(aws):
    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"203.0.113.9\n")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        p = AWS(ami=aws.ami, ip_lookup_url=f"http://127.0.0.1:{server.server_port}/")
        s = spec(1)
        instances = p.provision(s)
        group = aws.client().describe_security_groups(
            Filters=[{"Name": "tag:skyward:pool", "Values": [s.pool_id]}])["SecurityGroups"][0]
        cidrs = [x["CidrIp"] for r in group["IpPermissions"] for x in r.get("IpRanges", [])]
        p.terminate(instances)
    finally:
        server.shutdown()
    assert cidrs == ["203.0.113.9/32"]


def test_an_unreachable_lookup_url_is_a_config_error_before_anything_is_created(aws):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    p = AWS(ami=aws.ami, ip_lookup_url=f"http://127.0.0.1:{port}/")
    with pytest.raises(ConfigError) as info:
        p.provision(spec(1))
    assert info.value.parameter == "ssh_cidr"


def test_an_own_ssh_key_is_imported_as_the_pool_key_pair(aws, tmp_path):
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    (tmp_path / "id_ed25519.pub").unlink()  # the public half is derived from the private key
    p = provider(aws, ssh_key=str(key), allocation="on-demand")
    s = spec(1)
    instances = p.provision(s)
    try:
        assert aws_bookkeeping(p).pools[s.pool_id].key_path == str(key)
        pair = aws.client().describe_key_pairs(KeyNames=[f"skyward-{s.pool_id}"])["KeyPairs"][0]
        assert pair["KeyType"] == "ed25519"
    finally:
        p.terminate(instances)
    assert key.exists()  # the user's key is never deleted


def test_destroy_removes_every_pool_and_reports_nothing_left(aws):
    p = provider(aws, allocation="on-demand")
    first, second = p.provision(spec(1)), p.provision(spec(2))
    found = inventory.list_resources(api.EC2.connect())
    assert len(found.pools) == 2 and len(found.live_instances) == 3
    left = inventory.destroy(api.EC2.connect(), None)
    assert left.empty
    p.terminate(first + second)  # already gone: confirmed at once, nothing raised
    assert not aws_bookkeeping(p).pools
