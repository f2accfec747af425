"""The managed jobs' controller on AWS, against the moto server, with the instances placed on
the SSH test hosts as tests/test_aws_clusters.py places them.

An AWS job gets the AWS controller by default (``SKYWARD_JOBS_CONTROLLER`` unset). Two clients
submit the first two jobs at once, each with a subnet of its own: one launches the controller
(its instance on the lowest address of its subnet), the other waits for it and attaches; each
job's instance takes an address of its client's subnet (moto hands out a subnet's addresses in
order and never frees a terminated instance's, hence a subnet per job: both subnets hold only
the two hosts' addresses), so one job runs on the other host and one on the controller's.

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
import ipaddress
import json
import os
import pickle
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

import skyward as sky
from skyward.clusters import manage
from skyward.clusters.state import ClusterStore
from skyward.jobs import aws as aws_jobs
from skyward.jobs import client
from skyward.jobs.controller import IDLE_VARIABLE
from skyward.jobs.remote import VARIABLE, controller_home
from tests.aws_conftest import aws, moto_server  # noqa: F401  (fixtures)
from tests.contract.test_clusters import home  # noqa: F401  (a SKYWARD_HOME of the test's own)
from tests.hosts.conftest_fixture import downloaded_wheels
from tests.test_aws_clusters import ROOT, cluster_on_hosts, hosts_needed  # noqa: F401  (a fixture)
from tests.test_aws_e2e import subnet_with_only
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
import json, os, sys, time
import skyward as sky
from skyward.providers.aws.provider import AWS
from tests.test_jobs_aws import hostname

ready, go = sys.argv[2], sys.argv[3]
open(ready, "w").close()
while not os.path.exists(go):  # (the two first submits start on the same event)
    time.sleep(0.002)
print(sky.jobs.launch(hostname(), provider=AWS(**json.loads(sys.argv[1]))).id, flush=True)
"""


@sky.compute
def hostname() -> str:
    return socket.gethostname()


@pytest.fixture
def controller_on_hosts(aws, home, cluster_on_hosts, monkeypatch) -> Iterator[dict]:  # noqa: F811
    """``SKYWARD_JOBS_CONTROLLER`` unset; the hosts' ``~/.aws`` lead to moto; moto records. The
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
    monkeypatch.delenv(VARIABLE, raising=False)  # (an AWS job's controller is on AWS by default)
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


def submit_at_once(kwargs: list[dict], folder: Path) -> list[int]:
    """The ids of one job per ``kwargs`` (an AWS provider's), each submitted by a client of its
    own, all clients starting their submit on the same event; each has exited when this returns."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    go = folder / "go"
    procs = [subprocess.Popen([sys.executable, "-c", SUBMIT, json.dumps(k), str(folder / f"ready{n}"), str(go)],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for n, k in enumerate(kwargs)]
    assert wait_until(lambda: all((folder / f"ready{n}").exists() for n in range(len(kwargs))), timeout=60)
    go.touch()
    answers = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-3000:] for _, err in answers]
    return [int(out) for out, _ in answers]


@hosts_needed
@pytest.mark.timeout(300)  # (the hosts' setup and two clients: over 120 s on a loaded machine)
def test_two_first_aws_jobs_at_once_run_under_one_controller_instance_that_may_only_launch_tagged_instances(
        aws, controller_on_hosts, cluster_on_hosts, tmp_path, monkeypatch):  # noqa: F811
    hosts = cluster_on_hosts["hosts"]
    network = ipaddress.ip_interface(f"{hosts[0].bridge_ip}/24").network
    subnets = [controller_on_hosts["subnet_id"], subnet_with_only(aws, network, [h.ip for h in hosts])]
    monkeypatch.setenv(IDLE_VARIABLE, "3")  # (the controller the first ask starts exits 3 s after its last job)
    jobs = submit_at_once([{**controller_on_hosts, "subnet_id": s} for s in subnets], tmp_path)
    assert sorted(jobs) == [1, 2]  # (the clients exited, the jobs go on)

    # one controller, launched by one client, attached to by the other: a one-node named cluster
    # on an on-demand t3.medium, autostopped (stopped, not ended)
    record = ClusterStore().get(aws_jobs.CLUSTER)
    assert record is not None and (record.nodes, record.idle_minutes, record.down) == (1, 10.0, False)
    kinds = [e.kind for e in ClusterStore().events(aws_jobs.CLUSTER)]
    assert kinds.count("launch") == 1 and kinds.count("attach") >= 1, kinds
    on_demand = [i for i in instances(aws).values() if i.get("InstanceLifecycle") != "spot"]
    [controller] = on_demand
    assert (controller["InstanceId"], controller["InstanceType"]) == (record.instances[0].id, "t3.medium")
    controller_host = next(h for h in hosts if h.ip == record.instances[0].private_addr)

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

    # both jobs ran, one on each host (one on the controller's), and SUCCEEDED
    assert sorted(sky.jobs.get(j).result(timeout=180) for j in jobs) == sorted(h.name for h in hosts)
    assert [(j.id, j.status) for j in sky.jobs.list()] == [(1, "SUCCEEDED"), (2, "SUCCEEDED")]
    assert wait_until(lambda: all(client.get(j).cleaned for j in jobs), timeout=60)
    # three instances were ever launched: the jobs' are terminated, the controller's runs on
    states = {i: s["State"]["Name"] for i, s in instances(aws).items()}
    assert len(states) == 3 and states.pop(controller["InstanceId"]) == "running"
    assert set(states.values()) <= {"shutting-down", "terminated"}
    # the controller, with its own credentials, launched and ended them, within its policy
    used = actions_called_by(aws, CONTROLLER_KEY)
    assert {"ec2:RunInstances", "ec2:TerminateInstances", "ec2:DeleteSecurityGroup"} <= used <= POLICY_ACTIONS

    # autostop: the controller exits once idle, then the cluster's workers (its autostop, made
    # short here): the instance is left to its watchdog, which powers it off, a stop as launched
    # (moto runs no watchdog: EC2's side is asked here)
    assert manage.autostop(aws_jobs.CLUSTER, 0.05) == []
    log = Path(controller_host.home) / controller_home(record).removeprefix("~/") / "managed" / "controller.log"
    assert wait_until(lambda: not controller_host.processes(r"skyward\.(jobs\.controller|worker)"), timeout=60), \
        (controller_host.process_cmdlines("skyward"), log.read_text()[-3000:])
    aws.client().stop_instances(InstanceIds=[controller["InstanceId"]])
    assert [s.status for s in manage.status([aws_jobs.CLUSTER])] == ["STOPPED"]
    # a later submit starts it again (the same instance, no other launched), and the controller's
    # records were kept: the third job joins the first two
    (tmp_path / "later").mkdir()
    third = subnet_with_only(aws, network, [h.ip for h in hosts])
    assert submit_at_once([{**controller_on_hosts, "subnet_id": third}], tmp_path / "later") == [3]
    assert instances(aws)[controller["InstanceId"]]["State"]["Name"] == "running"
    assert [i["InstanceId"] for i in instances(aws).values() if i.get("InstanceLifecycle") != "spot"] == [
        controller["InstanceId"]] and ClusterStore().get(aws_jobs.CLUSTER).instances == record.instances
    assert sky.jobs.get(3).result(timeout=180) in {h.name for h in hosts}
    assert [(j.id, j.status) for j in sky.jobs.list()] == [(1, "SUCCEEDED"), (2, "SUCCEEDED"), (3, "SUCCEEDED")]
    kinds = [e.kind for e in ClusterStore().events(aws_jobs.CLUSTER)]
    assert (kinds.count("launch"), kinds.count("start")) == (1, 1), kinds
    assert wait_until(lambda: client.get(3).cleaned, timeout=60)
    # IAM unchanged by a second run
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


def test_an_aws_job_gets_the_aws_controller_unless_the_variable_says_where_and_an_unknown_value_is_named(
        home, tmp_path, monkeypatch) -> None:  # noqa: F811
    from skyward.jobs.store import CallPlan
    from skyward.launch import plan as load_plan
    from skyward.providers.aws.provider import AWS

    (tmp_path / "aws.yaml").write_text("resources:\n  cloud: aws\nrun: hostname\n")
    (tmp_path / "infra.yaml").write_text("resources:\n  infra: aws/us-west-2\nrun: hostname\n")
    (tmp_path / "here.yaml").write_text("run: hostname\n")
    task_on_aws, task_on_infra, task_here = (load_plan(str(tmp_path / f"{n}.yaml")) for n in ("aws", "infra", "here"))
    call_on_aws, call_here = (CallPlan("hostname", b"", pickle.dumps({"provider": p}), False, 1)
                              for p in (AWS("us-east-1"), sky.Local()))
    monkeypatch.delenv(VARIABLE, raising=False)
    assert [aws_jobs.chosen(p) for p in (task_on_aws, task_on_infra, call_on_aws, task_here, call_here, None)] == [
        True, True, True, False, False, False]  # (no controller on AWS yet: asks go to this machine's)
    monkeypatch.setenv(VARIABLE, "local")
    assert not aws_jobs.chosen(task_on_aws) and not aws_jobs.chosen(call_on_aws)
    assert client.jobs() == []  # (this machine's controller, which has none)
    monkeypatch.setenv(VARIABLE, "AWS")
    assert aws_jobs.chosen(task_here) and aws_jobs.chosen(None)
    monkeypatch.setenv(VARIABLE, "aws-please")
    assert not aws_jobs.chosen(task_on_aws)
    with pytest.raises(sky.ConfigError, match=r"invalid SKYWARD_JOBS_CONTROLLER: expected 'aws' \(the controller on "
                                              r"an AWS instance\), 'local' \(this machine's\), or the name of a "
                                              r"one-node named cluster of this machine .*, got 'aws-please'"):
        sky.jobs.list()
