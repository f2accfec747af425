"""Task-file fields on AWS, against moto's server (a real HTTP endpoint on loopback): buckets
copied to the nodes with boto3, the GPUs a node reports, the root volume's tier, the ports
opened, the zone, and accelerator candidates falling back on capacity errors."""

from __future__ import annotations

import os
import textwrap
import uuid
from io import StringIO
from pathlib import Path
from typing import Any

import pytest

import skyward as sky
from skyward import events as ev
from skyward.launch.taskfile.stores import find_tool
from skyward.accelerators import parse_accelerator
from skyward.launch import execute, plan
from skyward.providers.base import PoolSpec
from tests.aws_conftest import aws, moto_server  # noqa: F401  (fixtures)

CLIENT_CIDR = "198.51.100.7/32"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "task.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def provider(env: Any, **options: Any) -> sky.AWS:
    return sky.AWS(ami=env.ami, ssh_cidr=CLIENT_CIDR, allocation="on-demand", **options)


def described(env: Any, ids: list[str]) -> list[dict[str, Any]]:
    return [i for r in env.client().describe_instances(InstanceIds=ids)["Reservations"] for i in r["Instances"]]


# -- buckets --------------------------------------------------------------------------------------


def test_s3_file_mounts_are_copied_to_every_node_with_boto3(aws, tmp_path: Path) -> None:
    s3 = aws.client("s3")
    bucket = f"skyward-test-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="data/a.txt", Body=b"alpha\n")
    s3.put_object(Bucket=bucket, Key="data/sub/b.txt", Body=b"beta\n")
    s3.put_object(Bucket=bucket, Key="model.bin", Body=b"weights\n")
    try:
        task = write(tmp_path, f"""
            num_nodes: 2
            envs: {{BUCKET: {bucket}}}
            file_mounts:
              {tmp_path}/data: s3://${{BUCKET}}/data
              {tmp_path}/whole: {{name: $BUCKET, mode: MOUNT}}
              {tmp_path}/one.bin: s3://{bucket}/model.bin
            run: |
              cat {tmp_path}/data/a.txt {tmp_path}/data/sub/b.txt
              cat {tmp_path}/whole/data/a.txt {tmp_path}/whole/data/sub/b.txt {tmp_path}/one.bin
        """)
        p = plan(task)
        assert "mode MOUNT: mounted where the node has mount-s3, goofys, s3fs or rclone" in "\n".join(p.warnings)
        assert not [t for t in ("mount-s3", "goofys", "s3fs", "rclone") if find_tool(t)], \
            "this test is of a node without a mount tool"
        lines: list[tuple[int, str]] = []

        def on_event(event: ev.Event) -> None:
            if isinstance(event, ev.TaskOutput):
                lines.append((event.node, event.line))

        err = StringIO()
        code = execute(p, console=False, on_event=on_event, err=err)
        assert code == 0, err.getvalue()
        for node in (0, 1):
            assert [line for n, line in lines if n == node] == ["alpha", "beta", "alpha", "beta", "weights"]
        assert (tmp_path / "whole" / "model.bin").read_text() == "weights\n"
        assert (tmp_path / "one.bin").read_text() == "weights\n"
        said = [line for line in err.getvalue().splitlines() if "not mounted" in line]
        assert said == [f"skyward: file_mounts['{tmp_path}/whole']: s3://{bucket} copied, not mounted, on this "
                        "machine (no mount tool: mount-s3, goofys, s3fs, rclone); what the task writes there is not "
                        "uploaded"], err.getvalue()
    finally:
        for item in s3.list_objects_v2(Bucket=bucket).get("Contents", []):
            s3.delete_object(Bucket=bucket, Key=item["Key"])
        s3.delete_bucket(Bucket=bucket)


def test_r2_and_other_s3_compatible_stores_are_copied_with_the_aws_cli_and_the_stores_profile(
        aws, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # SkyPilot's R2 setup: an AWS CLI profile named r2 (here pointing at the moto server).
    Path(os.environ["AWS_CONFIG_FILE"]).write_text(f"[profile r2]\nregion = auto\nendpoint_url = {aws.endpoint}\n")
    Path(os.environ["AWS_SHARED_CREDENTIALS_FILE"]).write_text(
        "[r2]\naws_access_key_id = testing\naws_secret_access_key = testing\n")
    assert find_tool("aws"), "the AWS CLI copies R2 buckets"
    s3 = aws.client("s3")
    only_the_profile = monkeypatch.context()  # the nodes find the endpoint and the keys in profile r2 alone
    bucket = f"skyward-r2-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="data/a.txt", Body=b"alpha\n")
    s3.put_object(Bucket=bucket, Key="data/sub/b.txt", Body=b"beta\n")
    s3.put_object(Bucket=bucket, Key="model.bin", Body=b"weights\n")
    try:
        with only_the_profile as env:
            for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
                env.delenv(name)
            task = write(tmp_path, f"""
                file_mounts:
                  {tmp_path}/data: r2://{bucket}/data
                  {tmp_path}/one.bin: {{source: r2://{bucket}/model.bin, mode: MOUNT}}
                run: cat {tmp_path}/data/a.txt {tmp_path}/data/sub/b.txt {tmp_path}/one.bin
            """)
            p = plan(task)
            assert f"bucket: r2://{bucket}/data -> {tmp_path}/data (copied with aws on every node)" in p.describe()
            assert "mode MOUNT is copied (COPY): Skyward mounts no Cloudflare R2" in "\n".join(p.warnings)
            err = StringIO()
            assert execute(p, console=False, err=err) == 0, err.getvalue()
            assert (tmp_path / "data" / "sub" / "b.txt").read_text() == "beta\n"
            assert (tmp_path / "one.bin").read_text() == "weights\n"
            missing = write(tmp_path, f"file_mounts: {{{tmp_path}/x: 'r2://{bucket}-gone/data'}}\nrun: echo\n")
            err = StringIO()
            assert execute(plan(missing), console=False, err=err) == 1
            assert f"could not copy r2://{bucket}-gone/data" in err.getvalue() and "with aws" in err.getvalue()
    finally:
        for item in s3.list_objects_v2(Bucket=bucket).get("Contents", []):
            s3.delete_object(Bucket=bucket, Key=item["Key"])
        s3.delete_bucket(Bucket=bucket)


def test_a_missing_bucket_fails_the_launch_naming_it(aws, tmp_path: Path) -> None:
    task = write(tmp_path, f"file_mounts: {{{tmp_path}/d: 's3://no-such-bucket-{uuid.uuid4().hex[:6]}'}}\nrun: echo\n")
    err = StringIO()
    assert execute(plan(task), console=False, err=err) == 1
    assert "no-such-bucket" in err.getvalue() and "NoSuchBucket" in err.getvalue()


# -- the machines -----------------------------------------------------------------------------------


def test_a_node_reports_the_gpus_asked_for_not_all_its_type_has(aws) -> None:
    p = provider(aws)
    spec = PoolSpec(uuid.uuid4().hex[:8], 1, parse_accelerator("L4:2"))
    instances = p.provision(spec)
    try:
        assert described(aws, [instances[0].id])[0]["InstanceType"] == "g6.12xlarge"  # 4 x L4
        assert instances[0].accelerators == 2  # SKYPILOT_NUM_GPUS_PER_NODE and processes: 2
    finally:
        p.terminate(instances)


def test_disk_tier_ports_zone_and_labels_reach_ec2(aws, tmp_path: Path) -> None:
    from skyward.launch import make_provider

    task = write(tmp_path, """
        resources:
          infra: aws/us-east-1/us-east-1b
          disk_size: 200
          disk_tier: medium
          ports: [8000, "9000-9010"]
          labels: {team: ml}
        run: echo
    """)
    p = plan(task)
    assert p.provider == "aws" and "root disk 200 GB, tier medium, ports 8000, 9000-9010 open, zone us-east-1b" \
        in p.describe()
    import boto3

    made = make_provider(p)
    bodies: list[dict[str, Any]] = []
    session = boto3.Session()  # what boto3 sends (moto's RunInstances drops a volume's IOPS)
    session.events.register("before-call.ec2.RunInstances", lambda params, **_: bodies.append(params["body"]))
    aws_provider = sky.AWS(ami=aws.ami, ssh_cidr=CLIENT_CIDR, allocation="on-demand", disk_gb=made.disk_gb,
                           disk_tier=made.disk_tier, ports=made.ports, zone=made.zone, labels=made.labels,
                           session=session)
    spec = PoolSpec(uuid.uuid4().hex[:8], 1, None)
    instances = aws_provider.provision(spec)
    try:
        item = described(aws, [instances[0].id])[0]
        assert item["Placement"]["AvailabilityZone"] == "us-east-1b"
        tags = {t["Key"]: t["Value"] for t in item["Tags"]}
        assert tags["team"] == "ml" and tags["skyward:pool"] == spec.pool_id
        root = [m["Ebs"]["VolumeId"] for m in item["BlockDeviceMappings"] if m["DeviceName"] == item["RootDeviceName"]]
        volume = aws.client().describe_volumes(VolumeIds=root)["Volumes"][0]
        assert (volume["Size"], volume["VolumeType"]) == (200, "gp3")
        sent = {k.split(".")[-1]: v for k, v in bodies[0].items() if k.startswith("BlockDeviceMapping.1.Ebs.")}
        assert (sent["VolumeType"], sent["Iops"], sent["Throughput"]) == ("gp3", 6000, 500)
        group = aws.client().describe_security_groups(
            Filters=[{"Name": "tag:skyward:pool", "Values": [spec.pool_id]}])["SecurityGroups"][0]
        tcp = sorted((r["FromPort"], r["ToPort"], [x["CidrIp"] for x in r["IpRanges"]])
                     for r in group["IpPermissions"] if r["IpProtocol"] == "tcp")
        assert tcp == [(22, 22, [CLIENT_CIDR]), (8000, 8000, [CLIENT_CIDR]), (9000, 9010, [CLIENT_CIDR])]
    finally:
        aws_provider.terminate(instances)


def test_the_fastest_tiers_are_io2_volumes_with_iops_ebs_allows_for_their_size() -> None:
    from skyward.providers.aws.ec2 import volume_settings

    assert volume_settings(200, "high") == {"VolumeType": "io2", "Iops": 16000}
    assert volume_settings(100, "best") == {"VolumeType": "io2", "Iops": 50000}  # 500 IOPS per GB
    assert volume_settings(100, None) == {"VolumeType": "gp3"}


def test_an_unknown_zone_is_refused_before_anything_is_launched(aws) -> None:
    p = provider(aws, zone="us-east-1z")
    with pytest.raises(sky.ConfigError) as info:
        p.validate(PoolSpec(uuid.uuid4().hex[:8], 1, None))
    assert info.value.parameter == "zone" and "us-east-1a" in str(info.value)


def test_accelerator_candidates_fall_back_on_capacity_errors_cheapest_first(aws, tmp_path: Path) -> None:
    import boto3
    from botocore.exceptions import ClientError

    tried: list[str] = []

    def refuse(params: dict, **_: Any) -> None:
        tried.append(params["body"].get("InstanceType"))
        code = "InsufficientInstanceCapacity" if tried[-1].startswith("g4dn.") else "UnauthorizedOperation"
        raise ClientError({"Error": {"Code": code, "Message": "refused by the test"}}, "RunInstances")

    session = boto3.Session()
    session.events.register("before-call.ec2.RunInstances", refuse)
    task = write(tmp_path, "resources: {infra: aws, accelerators: {A10G:1, T4:1}}\nrun: echo\n")
    p = plan(task)
    assert [c.accelerator for c in p.candidates] == ["T4:1", "A10G:1"]  # cheapest first, not as written
    err = StringIO()
    code = execute(p, provider=sky.AWS(ami=aws.ami, ssh_cidr=CLIENT_CIDR, allocation="on-demand",
                                       session=session), console=False, err=err)
    assert code == 1
    assert tried[0] == "g4dn.xlarge" and "g5.xlarge" in tried
    assert "no capacity for accelerators=T4:1" in err.getvalue() and "trying accelerators=A10G:1" in err.getvalue()


# -- the catalog ------------------------------------------------------------------------------------


def test_catalog_refresh_builds_a_dated_catalog_from_the_ec2_api_and_plans_read_it(aws, tmp_path: Path,
                                                                                  monkeypatch) -> None:
    import subprocess
    import sys
    from datetime import UTC, datetime

    root = Path(__file__).resolve().parents[1]
    monkeypatch.setenv("SKYWARD_HOME", str(tmp_path / "home"))
    env = {**__import__("os").environ, "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-m", "skyward.cli", "catalog", "refresh", "--region", "us-east-1"],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    import json

    data = json.loads((tmp_path / "home" / "catalog" / "aws-us-east-1.json").read_text())
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    assert data["fetched_at"].startswith(today) and data["region"] == "us-east-1"
    by_name = {t["name"]: t for t in data["instance_types"]}
    assert (by_name["p5.4xlarge"]["gpu"], by_name["p5.4xlarge"]["gpu_count"]) == ("H100", 1)
    assert (by_name["g6.12xlarge"]["gpu"], by_name["g6.12xlarge"]["gpu_count"]) == ("L4", 4)
    assert "unavailable" in data["sources"]["on_demand"]  # moto has no Price List API: the snapshot's kept
    assert by_name["p5.4xlarge"]["price_per_hour"] == 6.88
    task = write(tmp_path, "resources: {infra: aws/us-east-1, accelerators: H100:1}\nrun: echo\n")
    done = subprocess.run([sys.executable, "-m", "skyward.cli", "launch", str(task), "--dryrun"], env={
        **env, "SKYWARD_HOME": str(tmp_path / "home")}, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "1 x p5.4xlarge" in done.stdout
    assert f"us-east-1 on-demand prices fetched {today} (0 days old" in done.stdout


def test_on_demand_prices_are_read_from_the_price_list_api() -> None:
    import json

    import boto3
    from botocore.stub import Stubber

    from skyward.providers.aws.catalog_cache import on_demand_prices

    pricing = boto3.client("pricing", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    item = {"product": {"attributes": {"instanceType": "p5.4xlarge"}},
            "terms": {"OnDemand": {"T": {"priceDimensions": {"D": {"pricePerUnit": {"USD": "6.8800000000"}}}}}}}
    with Stubber(pricing) as stub:  # AWS's answer at the boundary; the parsing is ours
        stub.add_response("get_products", {"PriceList": [json.dumps(item)], "FormatVersion": "aws_v1"})
        assert on_demand_prices(pricing, "us-east-1") == {"p5.4xlarge": 6.88}
