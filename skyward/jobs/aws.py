"""The managed jobs' controller on AWS (SkyPilot's model).

Which controller a job gets (:func:`chosen`): ``SKYWARD_JOBS_CONTROLLER`` decides when it is set
(``aws``: this one; ``local``: this machine's; else a cluster's name, :mod:`skyward.jobs.remote`).
Unset, a job whose provider is AWS (a Python call's ``AWS`` provider, a task file's ``cloud:
aws`` or ``infra: aws``) gets this one, and once this machine has launched it every job and
every ask goes to it, as SkyPilot's one jobs controller.

The controller lives on a small on-demand instance, the one-node named cluster :data:`CLUSTER`,
and every ``skyward jobs`` command and ``sky.jobs`` call asks it as it asks a controller on an
SSH host (:mod:`skyward.jobs.remote`):

1. the first submit launches it, through the AWS provider, on-demand (never spot), as a
   :data:`INSTANCE_TYPE`, with the same region, network, image and login settings as the job's
   own AWS provider (a task file's ``cloud: aws`` job, or a job of another provider: the AWS
   defaults), and with :data:`PACKAGES` in its environment;
2. it is given the instance profile :data:`ROLE` (made on first use, idempotently, through
   IAM: a role that EC2 may assume, with the inline policy :func:`policy`, the least the
   controller needs to launch, watch and end the jobs' instances, limited to skyward-tagged
   resources where EC2 can check the tag), associated with the instance once it runs;
3. later submits reuse it: attaching to it starts it again when its autostop stopped it;
   submits at once (two processes, the first ones or not) launch one: the named cluster's own
   hold (:func:`skyward.clusters.state.hold`) lets one process launch or attach at a time, and
   the others wait for it (up to :data:`LAUNCH_WAIT` seconds), then attach;
4. its autostop is the named cluster's own, :data:`AUTOSTOP_MINUTES` idle minutes; the
   controller process counts as a running job of the cluster while it watches jobs (it exits
   10 minutes after the last one), so the instance stops once no job has run for a while, and
   keeps its disk (the controller's records) for the next start.

Other asks (queue, logs, cancel) need the controller up: with the variable ``aws`` before the
first submit there is none, a :class:`~skyward.ConfigError` says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import time
from typing import Any

from skyward.clusters.state import ClusterStore, hold
from skyward._optional import require
from skyward.errors import ClusterBusy, ClusterError, ConfigError
from skyward.jobs.remote import LOCAL, VARIABLE, RemoteController

__all__ = ["ACTIONS", "AUTOSTOP_MINUTES", "CLUSTER", "DISK_GB", "INSTANCE_TYPE", "LAUNCH_WAIT", "PACKAGES", "ROLE",
           "VALUE", "chosen", "controller", "ensure_profile", "is_aws_job", "policy", "provider_for"]

#: The value of ``SKYWARD_JOBS_CONTROLLER`` that puts the controller on AWS.
VALUE = "aws"
#: The controller's named cluster (one node).
CLUSTER = "sky-jobs-controller"
#: 2 vCPUs and 4 GiB: the controller's loop and up to 8 launcher processes at once.
INSTANCE_TYPE = "t3.medium"
#: Its disk, in GiB (its AMI's own minimum when that is larger): the controller's records.
DISK_GB = 50
#: The controller cluster's autostop (idle minutes; the instance stops, its disk kept).
AUTOSTOP_MINUTES = 10.0
#: Seconds a submit waits for another process that is launching the controller (or attached to
#: it) to let go: a launch on EC2 takes a few minutes.
LAUNCH_WAIT = 900.0
#: What the controller's environment needs besides skyward (EC2 and SSH).
PACKAGES = ("boto3", "paramiko")
#: The IAM role, its inline policy and the instance profile: one name for the three.
ROLE = "skyward-jobs-controller"
TAG = "skyward:pool"  # (every instance, volume, key pair and security group skyward makes has it)

_TAGGED = {"Null": {f"aws:ResourceTag/{TAG}": "false"}}
_TAGGED_REQUEST = {"Null": {f"aws:RequestTag/{TAG}": "false"}}
_READS = ("ec2:DescribeImages", "ec2:DescribeInstanceTypeOfferings", "ec2:DescribeInstanceTypes",
          "ec2:DescribeInstances", "ec2:DescribeKeyPairs", "ec2:DescribeSecurityGroups", "ec2:DescribeSubnets",
          "ec2:DescribeVpcs")


def policy() -> dict[str, Any]:
    """The controller instance's permissions (an IAM policy document): what the AWS provider
    calls to launch, find and end a job's instances, and nothing else. Reads cannot be limited
    by resource on EC2; whatever creates is allowed only with the skyward tag in the request,
    whatever changes or deletes only on resources that carry it."""
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "Read", "Effect": "Allow", "Action": list(_READS), "Resource": "*"},
        {"Sid": "LaunchTagged", "Effect": "Allow", "Action": ["ec2:RunInstances"],
         "Resource": ["arn:aws:ec2:*:*:instance/*", "arn:aws:ec2:*:*:volume/*"], "Condition": _TAGGED_REQUEST},
        {"Sid": "LaunchWith", "Effect": "Allow", "Action": ["ec2:RunInstances"],
         "Resource": ["arn:aws:ec2:*::image/*", "arn:aws:ec2:*:*:subnet/*", "arn:aws:ec2:*:*:network-interface/*",
                      "arn:aws:ec2:*:*:security-group/*", "arn:aws:ec2:*:*:key-pair/*"]},
        {"Sid": "CreateTagged", "Effect": "Allow", "Action": ["ec2:CreateSecurityGroup", "ec2:ImportKeyPair"],
         "Resource": ["arn:aws:ec2:*:*:security-group/*", "arn:aws:ec2:*:*:key-pair/*"],
         "Condition": _TAGGED_REQUEST},
        {"Sid": "GroupInVpc", "Effect": "Allow", "Action": ["ec2:CreateSecurityGroup"],
         "Resource": ["arn:aws:ec2:*:*:vpc/*"]},
        {"Sid": "TagOnCreate", "Effect": "Allow", "Action": ["ec2:CreateTags"], "Resource": "*",
         "Condition": {"StringEquals": {"ec2:CreateAction": ["RunInstances", "CreateSecurityGroup",
                                                             "ImportKeyPair"]}}},
        {"Sid": "OnlyTagged", "Effect": "Allow",
         "Action": ["ec2:AuthorizeSecurityGroupIngress", "ec2:CreateTags", "ec2:DeleteKeyPair",
                    "ec2:DeleteSecurityGroup", "ec2:TerminateInstances"],
         "Resource": "*", "Condition": _TAGGED},
        {"Sid": "DefaultImage", "Effect": "Allow", "Action": ["ssm:GetParameter"],
         "Resource": ["arn:aws:ssm:*::parameter/aws/service/*"]},
    ]}


#: Every action :func:`policy` allows, sorted.
ACTIONS = tuple(sorted({a for s in policy()["Statement"] for a in s["Action"]}))
_TRUST = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"},
                                                  "Action": "sts:AssumeRole"}]}


def chosen(plan: object = None) -> bool:
    """Whether the managed jobs' controller is the one on AWS: ``SKYWARD_JOBS_CONTROLLER=aws``;
    or, with the variable unset, for an AWS job (``plan``, a job being submitted) or once this
    machine has launched it."""
    given = os.environ.get(VARIABLE, "").strip().lower()
    if given:
        return given == VALUE
    return (plan is not None and is_aws_job(plan)) or ClusterStore().get(CLUSTER) is not None


def is_aws_job(plan: object) -> bool:
    """Whether ``plan`` (a task file's, or a Python call's) runs on AWS."""
    from skyward.jobs.store import CallPlan

    if isinstance(plan, CallPlan):
        return type(pickle.loads(plan.pool).get("provider")).__module__.startswith("skyward.providers.aws")
    return getattr(plan, "provider", None) == VALUE


def ensure_profile(iam: Any) -> str:
    """The instance profile :data:`ROLE` (its name), with its role and the role's inline
    policy made first where missing; the policy is written again each time (it is the same
    document, or a newer skyward's). Another process making them at the same moment is no
    error. ``iam``: a boto3 IAM client."""
    missing, made = iam.exceptions.NoSuchEntityException, iam.exceptions.EntityAlreadyExistsException
    try:
        iam.get_role(RoleName=ROLE)
    except missing:
        with contextlib.suppress(made):
            iam.create_role(RoleName=ROLE, AssumeRolePolicyDocument=json.dumps(_TRUST),
                            Description="skyward's managed jobs' controller: launches and ends the jobs' instances")
    iam.put_role_policy(RoleName=ROLE, PolicyName=ROLE, PolicyDocument=json.dumps(policy()))
    try:
        profile = iam.get_instance_profile(InstanceProfileName=ROLE)["InstanceProfile"]
    except missing:
        with contextlib.suppress(made):
            iam.create_instance_profile(InstanceProfileName=ROLE)
        profile = iam.get_instance_profile(InstanceProfileName=ROLE)["InstanceProfile"]
    if ROLE not in [r["RoleName"] for r in profile.get("Roles", [])]:
        with contextlib.suppress(iam.exceptions.LimitExceededException):  # (a profile takes one role: added at once)
            iam.add_role_to_instance_profile(InstanceProfileName=ROLE, RoleName=ROLE)
    return ROLE


def provider_for(plan: object) -> Any:
    """The controller's provider: on-demand :data:`INSTANCE_TYPE` in the region, network, image
    and login settings of ``plan``'s AWS provider (the defaults when it has none)."""
    from skyward.jobs.store import CallPlan
    from skyward.providers.aws.provider import AWS

    given: Any = None
    if isinstance(plan, CallPlan):
        given = pickle.loads(plan.pool).get("provider")
    if not isinstance(given, AWS):
        region = getattr(plan, "region", None) if getattr(plan, "provider", None) == "aws" else None
        return AWS(region, instance_type=INSTANCE_TYPE, allocation="on-demand", disk_gb=DISK_GB)
    return AWS(given.region, instance_type=INSTANCE_TYPE, allocation="on-demand", disk_gb=DISK_GB, ami=given.ami,
               subnet_id=given.subnet_id, public_ip=given.public_ip, zone=given.zone, user=given.user,
               ssh_key=given.ssh_key, known_hosts=given.known_hosts, ssh_cidr=given.ssh_cidr,
               ip_lookup_url=given.ip_lookup_url, ssh_via=given.ssh_via, root=given.root,
               find_links=given.find_links, no_index=given.no_index, boot_timeout=given.boot_timeout,
               bootstrap_timeout=given.bootstrap_timeout, connect_timeout=given.connect_timeout,
               profile=given.profile)


def controller(plan: object = None) -> RemoteController:
    """The AWS controller. For a submit (``plan`` given), launched first when there is none
    (permissions made, :func:`provider_for` the plan), or started again when it was stopped;
    for any other ask it must exist. A submit that finds another process launching or attached
    to it waits for that one (:data:`LAUNCH_WAIT` seconds at most), then looks again."""
    if plan is None:
        if ClusterStore().get(CLUSTER) is None:
            raise ConfigError(VARIABLE, f"'{VALUE}' once a managed job was submitted (its first submit launches the "
                              f"controller, cluster {CLUSTER}), '{LOCAL}' (this machine's controller), or unset",
                              f"{VALUE}: no controller on AWS yet")
        return RemoteController(CLUSTER)
    deadline = time.monotonic() + LAUNCH_WAIT
    while True:
        try:
            _launch_or_attach(plan)
            return RemoteController(CLUSTER)
        except ClusterBusy:
            with hold(CLUSTER, "waiting for the controller", wait=max(0.0, deadline - time.monotonic())):
                pass  # (let go at once: the next look launches or attaches, as the record now says)


def _launch_or_attach(plan: object) -> None:
    from skyward.image import Image
    from skyward.pool import ComputePool

    if ClusterStore().get(CLUSTER) is not None:
        _attach()
        return
    provider = provider_for(plan)
    ensure_profile(_session(provider).client("iam"))
    try:
        with ComputePool(name=CLUSTER, provider=provider, nodes=1, image=Image(pip=list(PACKAGES)),
                         idle_minutes=AUTOSTOP_MINUTES, console=False) as pool:
            _associate(_session(provider).client("ec2"), pool.instances[0].id)
    except ClusterError as exc:  # (another process launched it, for a job of another network, since the look)
        if exc.field != "provider" or ClusterStore().get(CLUSTER) is None:
            raise
        _attach()


def _attach() -> None:
    """Attach to the controller's cluster and leave (which starts it again when autostop stopped it)."""
    from skyward.pool import ComputePool

    with ComputePool(name=CLUSTER, console=False):
        pass


def _session(provider: Any) -> Any:
    boto3 = require("boto3", "the managed-jobs controller on AWS")
    return boto3.Session(profile_name=provider.profile, region_name=provider.region)


def _associate(ec2: Any, instance: str) -> None:
    """Give ``instance`` the controller's instance profile (once)."""
    found = ec2.describe_iam_instance_profile_associations(
        Filters=[{"Name": "instance-id", "Values": [instance]}])["IamInstanceProfileAssociations"]
    if not any(a["State"] in ("associating", "associated") for a in found):
        ec2.associate_iam_instance_profile(IamInstanceProfile={"Name": ROLE}, InstanceId=instance)
