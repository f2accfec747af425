"""The managed jobs' controller on AWS (``SKYWARD_JOBS_CONTROLLER=aws``), against the moto
server, with the instances placed on the SSH test hosts as tests/test_aws_clusters.py places
them: the controller's instance on one host, the job's on the other.

The controller on its host reaches moto as an instance reaches EC2 with its instance profile:
through the host's ``~/.aws`` (moto's address as the host sees it, and credentials of its own,
``controller``), so that moto's request recorder tells the controller's calls from the client's.
moto keeps IAM roles, instance profiles and policies and associates a profile with an
instance, but evaluates no policy: that the controller needs no more than its policy is checked
from the recording instead (every EC2/SSM action the controller called is in the policy).
moto also runs no watchdog and powers no instance off: ending an instance leaves its host's
processes, which the test ends itself.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

import skyward as sky
from skyward.clusters.state import ClusterStore
from skyward.jobs import aws as aws_jobs
from skyward.jobs import client
from skyward.jobs.remote import VARIABLE, controller_home
from tests.aws_conftest import aws, moto_server  # noqa: F401  (fixtures)
from tests.contract.test_clusters import home  # noqa: F401  (a SKYWARD_HOME of the test's own)
from tests.hosts.conftest_fixture import downloaded_wheels
from tests.test_aws_clusters import ROOT, cluster_on_hosts, hosts_needed  # noqa: F401  (a fixture)
from tests.test_ssh import wait_until

#: The access key the controller's host signs its calls with (the client's is "testing").
CONTROLLER_KEY = "controller"
#: Every action the controller's instance profile allows, as docs/jobs.md shows them.
POLICY_ACTIONS = {
    "ec2:AuthorizeSecurityGroupIngress", "ec2:CreateSecurityGroup", "ec2:CreateTags", "ec2:DeleteKeyPair",
    "ec2:DeleteSecurityGroup", "ec2:DescribeImages", "ec2:DescribeInstanceTypeOfferings", "ec2:DescribeInstanceTypes",
    "ec2:DescribeInstances", "ec2:DescribeKeyPairs", "ec2:DescribeSecurityGroups", "ec2:DescribeSubnets",
    "ec2:DescribeVpcs", "ec2:ImportKeyPair", "ec2:RunInstances", "ec2:TerminateInstances", "ssm:GetParameter",
}
SUBMIT = """
import json, sys
import skyward as sky
from skyward.providers.aws.provider import AWS
from tests.test_jobs_aws import hostname

print(sky.jobs.launch(hostname(), provider=AWS(**json.loads(sys.argv[1]))).id, flush=True)
"""


@sky.compute
def hostname() -> str:
    return socket.gethostname()


@pytest.fixture
def controller_on_hosts(aws, home, cluster_on_hosts, monkeypatch) -> Iterator[dict]:  # noqa: F811
    """``SKYWARD_JOBS_CONTROLLER=aws``; the hosts' ``~/.aws`` lead to moto; moto records. The
    job's AWS arguments (spot, with the controller's packages in its wheelhouse) are yielded.
    Afterwards whatever the controller left (a failed test's) is ended, and its processes."""
    hosts = cluster_on_hosts["hosts"]
    port = urllib.parse.urlsplit(aws.endpoint).port
    for host in hosts:
        folder = Path(host.home, ".aws")
        folder.mkdir(exist_ok=True)
        (folder / "config").write_text(f"[default]\nregion = {aws.region}\n"
                                       f"endpoint_url = http://{host.bridge_ip}:{port}\n")
        (folder / "credentials").write_text(f"[default]\naws_access_key_id = {CONTROLLER_KEY}\n"
                                            "aws_secret_access_key = testing\n")
    monkeypatch.setenv(VARIABLE, "aws")
    wheels = [cluster_on_hosts["kwargs"]["find_links"][0], downloaded_wheels(aws_jobs.PACKAGES)]
    recorder(aws, "start")
    try:
        yield {**cluster_on_hosts["kwargs"], "allocation": "spot", "find_links": wheels}
    finally:
        recorder(aws, "stop")
        record = ClusterStore().get(aws_jobs.CLUSTER)
        for host in hosts:
            host.kill_processes(r"skyward\.jobs\.(controller|launcher)")
            there = Path(host.home) / controller_home(record).removeprefix("~/") if record else None
            if there is not None and (there / "state.db").exists() and ClusterStore(there / "state.db").all():
                skyward("down", "-a", "-y", home=str(there))
        if record is not None:
            skyward("down", aws_jobs.CLUSTER)
        for host in hosts:
            host.kill_processes("skyward")
            subprocess.run(["rm", "-rf", str(Path(host.home, ".aws"))], check=False)


def recorder(aws, verb: str) -> bytes:  # noqa: F811
    request = urllib.request.Request(f"{aws.endpoint}/moto-api/recorder/{verb}-recording",
                                     method="GET" if verb == "download" else "POST")
    with urllib.request.urlopen(request, timeout=10) as answer:
        return answer.read()


def actions_called_by(aws, key: str) -> set[str]:  # noqa: F811
    """The AWS actions moto recorded signed with access key ``key`` (``ec2:RunInstances``...)."""
    called = set()
    for line in recorder(aws, "download").decode().splitlines():
        entry = json.loads(line)
        headers = {k.lower(): v for k, v in entry["headers"].items()}
        if f"Credential={key}/" not in headers.get("authorization", ""):
            continue
        if "x-amz-target" in headers:  # (a JSON API: SSM)
            called.add("ssm:" + headers["x-amz-target"].rpartition(".")[2])
            continue
        body = entry["body"] or ""
        if entry["body_encoded"]:
            body = base64.b64decode(body).decode()
        called.add("ec2:" + urllib.parse.parse_qs(body)["Action"][0])
    return called


def skyward(*args: str, home: str | None = None) -> subprocess.CompletedProcess[str]:  # noqa: F811
    env = {**os.environ, "PYTHONPATH": str(ROOT), **({"SKYWARD_HOME": home} if home else {})}
    return subprocess.run([sys.executable, "-m", "skyward.cli", *args], env=env, capture_output=True, text=True,
                          timeout=300)


def instances(aws) -> dict[str, dict]:  # noqa: F811
    tagged = [{"Name": "tag-key", "Values": ["skyward:pool"]}]
    return {i["InstanceId"]: i for r in aws.client().describe_instances(Filters=tagged)["Reservations"]
            for i in r["Instances"]}


@hosts_needed
def test_a_managed_job_runs_under_a_controller_on_an_aws_instance_that_may_only_launch_tagged_instances(
        aws, controller_on_hosts, cluster_on_hosts):  # noqa: F811
    hosts = cluster_on_hosts["hosts"]
    submitted = subprocess.run([sys.executable, "-c", SUBMIT, json.dumps(controller_on_hosts)], cwd=ROOT,
                               env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                               timeout=300)
    assert submitted.returncode == 0, submitted.stderr[-3000:]  # (the client exited, the job goes on)
    job = int(submitted.stdout)

    # the controller: a one-node named cluster on an on-demand t3.medium, autostopped (stopped, not ended)
    record = ClusterStore().get(aws_jobs.CLUSTER)
    assert record is not None and (record.nodes, record.idle_minutes, record.down) == (1, 10.0, False)
    [controller] = [i for i in instances(aws).values() if i["InstanceId"] == record.instances[0].id]
    assert (controller["InstanceType"], controller.get("InstanceLifecycle", "on-demand")) == ("t3.medium",
                                                                                             "on-demand")
    controller_host = next(h for h in hosts if h.ip == record.instances[0].private_addr)
    job_host = next(h for h in hosts if h is not controller_host)

    # its instance profile, role and policy, read back from IAM
    iam = aws.client("iam")
    [association] = aws.client().describe_iam_instance_profile_associations(
        Filters=[{"Name": "instance-id", "Values": [controller["InstanceId"]]}])["IamInstanceProfileAssociations"]
    assert association["IamInstanceProfile"]["Arn"].endswith(f":instance-profile/{aws_jobs.ROLE}")
    profile = iam.get_instance_profile(InstanceProfileName=aws_jobs.ROLE)["InstanceProfile"]
    assert [r["RoleName"] for r in profile["Roles"]] == [aws_jobs.ROLE]
    trust = iam.get_role(RoleName=aws_jobs.ROLE)["Role"]["AssumeRolePolicyDocument"]
    assert [s["Principal"] for s in trust["Statement"]] == [{"Service": "ec2.amazonaws.com"}]
    assert iam.list_role_policies(RoleName=aws_jobs.ROLE)["PolicyNames"] == [aws_jobs.ROLE]
    assert iam.list_attached_role_policies(RoleName=aws_jobs.ROLE)["AttachedPolicies"] == []
    document = iam.get_role_policy(RoleName=aws_jobs.ROLE, PolicyName=aws_jobs.ROLE)["PolicyDocument"]
    statements = document["Statement"]
    assert {a for s in statements for a in s["Action"]} == POLICY_ACTIONS
    changing = {"ec2:AuthorizeSecurityGroupIngress", "ec2:DeleteKeyPair", "ec2:DeleteSecurityGroup",
                "ec2:TerminateInstances"}
    assert all(s.get("Condition") for s in statements if changing & set(s["Action"])), "not limited by tag"

    # the job ran on the other host, and SUCCEEDED
    assert sky.jobs.get(job).result(timeout=180) == job_host.name
    assert [(j.id, j.status) for j in sky.jobs.list()] == [(job, "SUCCEEDED")]
    assert wait_until(lambda: client.get(job).cleaned, timeout=60)
    # two instances were ever launched: the job's is terminated, the controller's runs on
    states = {i: s["State"]["Name"] for i, s in instances(aws).items()}
    assert len(states) == 2 and states.pop(controller["InstanceId"]) == "running"
    assert set(states.values()) <= {"shutting-down", "terminated"}
    # the controller, with its own credentials, launched and ended it, within its policy
    used = actions_called_by(aws, CONTROLLER_KEY)
    assert {"ec2:RunInstances", "ec2:TerminateInstances", "ec2:DeleteSecurityGroup"} <= used <= POLICY_ACTIONS

    # a later submit finds it and launches no other (what it does before asking: moto cannot place
    # a second job's instance, its subnet has no address left for it); IAM unchanged by a second run
    aws_jobs.controller(plan=object())
    assert len(instances(aws)) == 2 and ClusterStore().get(aws_jobs.CLUSTER).instances == record.instances
    assert aws_jobs.ensure_profile(iam) == aws_jobs.ROLE
    assert [p["InstanceProfileName"] for p in iam.list_instance_profiles()["InstanceProfiles"]] == [aws_jobs.ROLE]
    assert [r["RoleName"] for r in iam.list_roles()["Roles"]] == [aws_jobs.ROLE]

    ended = skyward("down", aws_jobs.CLUSTER)
    assert ended.returncode == 0, ended.stderr[-3000:]
    assert aws.leftovers() == {}
    controller_host.kill_processes(r"skyward\.jobs\.controller")  # (EC2 ends it with its instance; moto cannot)
    assert wait_until(lambda: not any(h.processes("skyward") for h in hosts), timeout=30), "processes left"


def test_the_policy_on_the_jobs_page_is_the_controllers_and_asking_before_any_submit_is_a_clear_error(
        home, monkeypatch) -> None:  # noqa: F811
    page = (ROOT / "docs" / "jobs.md").read_text()
    shown = page[page.index("**Its permissions**"):]
    shown = shown[shown.index("```json\n") + 8:]
    assert json.loads(shown[:shown.index("```")]) == aws_jobs.policy()
    assert set(aws_jobs.ACTIONS) == POLICY_ACTIONS
    monkeypatch.setenv(VARIABLE, "aws")
    with pytest.raises(sky.ConfigError, match=r"invalid SKYWARD_JOBS_CONTROLLER: expected 'aws' once a managed job "
                                              r"was submitted .*, got 'aws: no controller on AWS yet'"):
        sky.jobs.list()
