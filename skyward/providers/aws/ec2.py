"""A thin layer over boto3's EC2 client: requests planned without I/O, executed with translation.

*Plan* — the functions named ``*_request`` return the exact keyword arguments of one EC2 API
call, touching nothing, so what Skyward would ask AWS for can be checked offline.
*Execute* — :class:`EC2` sends them; every botocore exception is turned into a
:mod:`skyward.errors` type at this boundary (:func:`translate`), so none reaches the user:

* refused for capacity or quota (:data:`REFUSAL_CODES`) -> :class:`~skyward.errors.CapacityError`
* missing credentials / region / profile                 -> :class:`~skyward.errors.ConfigError`
* anything else (permissions, a bad AMI, no network...)  -> :class:`~skyward.errors.ProvisionError`

Every resource Skyward creates carries the tag ``skyward:pool=<pool id>``;
:mod:`skyward.providers.aws.inventory` finds and removes them by that tag.

boto3 is imported inside functions only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

from skyward._optional import require
from skyward.errors import CapacityError, ConfigError, ProvisionError, SkywardError

__all__ = [
    "GONE_STATES",
    "REFUSAL_CODES",
    "TAG_CREATED",
    "TAG_NODE",
    "TAG_POOL",
    "EC2",
    "ingress_request",
    "key_pair_request",
    "pool_filter",
    "resource_name",
    "run_instances_request",
    "security_group_request",
    "translate",
]

TAG_POOL = "skyward:pool"
TAG_NODE = "skyward:node"
TAG_CREATED = "skyward:created"

Market = Literal["spot", "on-demand"]

#: Error codes meaning "not now, not here": no capacity, or a quota reached. See
#: https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html —
#: ``Unsupported`` is what RunInstances answers when a type is not offered in the AZ.
REFUSAL_CODES = frozenset({
    "InsufficientInstanceCapacity",
    "InsufficientHostCapacity",
    "InsufficientReservedInstanceCapacity",
    "InsufficientCapacity",
    "InsufficientFreeAddressesInSubnet",
    "Unsupported",
    "SpotMaxPriceTooLow",
    "MaxSpotInstanceCountExceeded",
    "InstanceLimitExceeded",
    "VcpuLimitExceeded",
})
_QUOTA_CODES = frozenset({"MaxSpotInstanceCountExceeded", "InstanceLimitExceeded", "VcpuLimitExceeded"})
_NOT_FOUND_SUFFIX = ".NotFound"

#: Instance states that no longer bill for compute (the confirmation teardown waits for).
GONE_STATES = frozenset({"shutting-down", "terminated"})


def resource_name(pool_id: str) -> str:
    """The name of a pool's key pair and security group."""
    return f"skyward-{pool_id}"


def _now_tag() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _tags(pool_id: str, created: str, extra: Mapping[str, str] | None = None) -> list[dict[str, str]]:
    tags = {TAG_POOL: pool_id, TAG_CREATED: created, **dict(extra or {})}
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def pool_filter(pool_id: str | None) -> list[dict[str, Any]]:
    """``Filters`` matching one pool's resources, or (``None``) every skyward-tagged resource."""
    if pool_id is None:
        return [{"Name": "tag-key", "Values": [TAG_POOL]}]
    return [{"Name": f"tag:{TAG_POOL}", "Values": [pool_id]}]


# -- plan: exact requests, no I/O -------------------------------------------------------------------


def key_pair_request(pool_id: str, public_key: str, *, created: str | None = None) -> dict[str, Any]:
    """``ImportKeyPair``: the pool's public key (the private key never leaves the client)."""
    return {
        "KeyName": resource_name(pool_id),
        "PublicKeyMaterial": public_key.encode(),
        "TagSpecifications": [{"ResourceType": "key-pair", "Tags": _tags(pool_id, created or _now_tag())}],
    }


def security_group_request(pool_id: str, vpc_id: str, *, created: str | None = None) -> dict[str, Any]:
    """``CreateSecurityGroup`` in ``vpc_id`` (no ingress until :func:`ingress_request`)."""
    return {
        "GroupName": resource_name(pool_id),
        "Description": f"skyward pool {pool_id}: SSH from the client, all traffic within the pool",
        "VpcId": vpc_id,
        "TagSpecifications": [{"ResourceType": "security-group", "Tags": _tags(pool_id, created or _now_tag())}],
    }


def ingress_request(group_id: str, ssh_cidr: str, *, ssh_port: int = 22,
                    ports: Sequence[tuple[int, int]] = ()) -> dict[str, Any]:
    """``AuthorizeSecurityGroupIngress``: SSH from ``ssh_cidr`` only, and everything from the group.

    Members of the group reach each other on any port (DDP rendezvous and collectives); nothing
    else reaches any port but SSH and the ``ports`` asked for (TCP ranges, low to high), which
    are open to ``ssh_cidr`` too: the client's address, never the whole internet.
    """
    def ranges(what: str) -> dict[str, Any]:
        return ({"Ipv6Ranges": [{"CidrIpv6": ssh_cidr, "Description": f"skyward client ({what})"}]}
                if ":" in ssh_cidr else {"IpRanges": [{"CidrIp": ssh_cidr, "Description": f"skyward client ({what})"}]})

    return {
        "GroupId": group_id,
        "IpPermissions": [
            {"IpProtocol": "tcp", "FromPort": ssh_port, "ToPort": ssh_port, **ranges("SSH")},
            *({"IpProtocol": "tcp", "FromPort": low, "ToPort": high, **ranges("task ports")} for low, high in ports),
            {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group_id, "Description": "skyward pool members"}]},
        ],
    }


#: A task file's disk_tier as an EBS volume: gp3 at its baseline, gp3 with the IOPS and
#: throughput raised, or io2 (provisioned IOPS, capped at 500 per GB by EBS:
#: https://docs.aws.amazon.com/ebs/latest/userguide/provisioned-iops.html).
DISK_TIERS: Mapping[str, Mapping[str, Any]] = {
    "low": {"VolumeType": "gp3"},
    "medium": {"VolumeType": "gp3", "Iops": 6000, "Throughput": 500},
    "high": {"VolumeType": "io2", "Iops": 16000},
    "ultra": {"VolumeType": "io2", "Iops": 64000},
    "best": {"VolumeType": "io2", "Iops": 64000},
}


def volume_settings(disk_gb: int, tier: str | None) -> dict[str, Any]:
    """The root volume's type (and IOPS) for a disk tier; gp3 without one."""
    settings = dict(DISK_TIERS.get(tier or "low", DISK_TIERS["low"]))
    if settings["VolumeType"] == "io2":
        settings["Iops"] = max(100, min(settings["Iops"], 500 * disk_gb))
    return settings


def run_instances_request(
    *,
    pool_id: str,
    count: int,
    instance_type: str,
    image_id: str,
    subnet_id: str,
    group_id: str,
    key_name: str,
    market: Market,
    user_data: str,
    client_token: str,
    created: str | None = None,
    root_device: str | None = None,
    disk_gb: int | None = None,
    public_ip: bool | None = None,
    shutdown_behavior: str = "terminate",
    disk_tier: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """``RunInstances`` for all ``count`` nodes at once, in one subnet (so one AZ).

    ``MinCount == MaxCount``: EC2 launches all of them or none. ``client_token`` makes a
    retried call idempotent (botocore retries transient errors). Instances power off into
    termination (``InstanceInitiatedShutdownBehavior``; ``shutdown_behavior="stop"``, for a
    named cluster, stops on-demand ones instead), spot ones are one-time requests
    terminated on interruption, and IMDSv2 is required. Instances and volumes are tagged at
    creation, so even one whose launch answer was lost is found by its tag.
    """
    created = created or _now_tag()
    request: dict[str, Any] = {
        "ImageId": image_id,
        "InstanceType": instance_type,
        "MinCount": count,
        "MaxCount": count,
        "KeyName": key_name,
        "UserData": user_data,
        "ClientToken": client_token,
        # (a one-time spot instance cannot stop: it terminates)
        "InstanceInitiatedShutdownBehavior": "terminate" if market == "spot" else shutdown_behavior,
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
        "TagSpecifications": [
            {"ResourceType": "instance",
             # A task's labels are tags too; they never replace skyward's own.
             "Tags": _tags(pool_id, created, {**dict(labels or {}), "Name": resource_name(pool_id)})},
            {"ResourceType": "volume", "Tags": _tags(pool_id, created)},
        ],
    }
    if public_ip is None:
        request["SubnetId"] = subnet_id
        request["SecurityGroupIds"] = [group_id]
    else:  # the subnet's own setting is overridden through the primary interface
        request["NetworkInterfaces"] = [{
            "DeviceIndex": 0, "SubnetId": subnet_id, "Groups": [group_id],
            "AssociatePublicIpAddress": public_ip, "DeleteOnTermination": True,
        }]
    if market == "spot":
        request["InstanceMarketOptions"] = {
            "MarketType": "spot",
            "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
        }
    if disk_gb is not None and root_device:
        request["BlockDeviceMappings"] = [{
            "DeviceName": root_device,
            # Encrypted explicitly: not left to the account's "encryption by default" setting
            # (with the account's default KMS key when no other is configured).
            "Ebs": {"VolumeSize": disk_gb, **volume_settings(disk_gb, disk_tier), "DeleteOnTermination": True,
                    "Encrypted": True},
        }]
    return request


# -- execute: calls with errors translated -----------------------------------------------------------


def _hint(code: str) -> str:
    if code in ("VcpuLimitExceeded", "InstanceLimitExceeded", "MaxSpotInstanceCountExceeded"):
        return ("; raise the quota in the Service Quotas console (EC2: 'Running On-Demand ... instances' "
                "or 'All ... Spot Instance Requests' for this instance family)")
    if code in ("AuthFailure", "UnauthorizedOperation", "AccessDenied", "AccessDeniedException"):
        return "; check the credentials and that their IAM policy allows what docs/aws.md lists"
    if code.startswith("InvalidAMIID"):
        return "; pass ami= an image that exists in this region"
    return ""


def translate(exc: BaseException, operation: str, *, instance_type: str = "", zone: str = "",
              region: str = "") -> SkywardError:
    """The :mod:`skyward.errors` exception for a botocore exception (others are wrapped as-is).

    A :class:`ProvisionError` keeps AWS's error code as ``code`` (``""`` when there is none);
    its message names the region when one is given.
    """
    bx = require("botocore.exceptions", "sky.AWS")

    error: SkywardError
    if isinstance(exc, SkywardError):
        return exc
    if region:
        operation = f"{operation} in {region}"
    if isinstance(exc, bx.ClientError):
        info = exc.response.get("Error", {})
        code = str(info.get("Code", ""))
        message = str(info.get("Message", "")) or str(exc)
        text = f"EC2 {operation} refused: {code}: {message}{_hint(code)}"
        cls = CapacityError if code in REFUSAL_CODES else ProvisionError
        error = cls(text, provider="aws", instance_type=instance_type, zone=zone, code=code)
    elif isinstance(exc, (bx.NoCredentialsError, bx.PartialCredentialsError)):
        error = ConfigError("credentials", "AWS credentials: environment variables, ~/.aws/credentials, "
                            "AWS_PROFILE / an SSO login, or an instance role", None, detail=str(exc))
    elif isinstance(exc, bx.NoRegionError):
        error = ConfigError("region", "an AWS region such as 'us-east-1' (region=, AWS_DEFAULT_REGION "
                            "or ~/.aws/config)", None)
    elif isinstance(exc, bx.ProfileNotFound):
        error = ConfigError("profile", "a profile defined in ~/.aws/config", getattr(exc, "kwargs", {}).get("profile"))
    elif isinstance(exc, (bx.EndpointConnectionError, bx.ConnectTimeoutError, bx.ReadTimeoutError)):
        error = ProvisionError(f"cannot reach the EC2 API for {operation}: {exc}", provider="aws",
                               instance_type=instance_type, zone=zone)
    else:
        error = ProvisionError(f"EC2 {operation} failed: {type(exc).__name__}: {exc}", provider="aws",
                               instance_type=instance_type, zone=zone)
    return error


@contextlib.contextmanager
def translated(operation: str, *, instance_type: str = "", zone: str = "", region: str = "") -> Iterator[None]:
    """Translate botocore exceptions raised inside the block (see :func:`translate`)."""
    bx = require("botocore.exceptions", "sky.AWS")
    BotoCoreError, ClientError = bx.BotoCoreError, bx.ClientError

    try:
        yield
    except (BotoCoreError, ClientError) as exc:
        raise translate(exc, operation, instance_type=instance_type, zone=zone, region=region) from exc


def check_region(session: Any, name: str) -> None:
    """ConfigError unless ``name`` is a region botocore knows for EC2, in any partition.

    Checked before any call: a mistyped region (``us-est-1``) would otherwise surface as
    whatever the unknown endpoint answers (a DNS failure, an unparseable reply).
    """
    import difflib

    try:
        known = {r for partition in session.get_available_partitions()
                 for r in session.get_available_regions("ec2", partition_name=partition)}
    except Exception:  # botocore's data unreadable: let the call itself say what is wrong
        return
    if not known or name in known:
        return
    close = difflib.get_close_matches(name, sorted(known), n=3)
    detail = f"did you mean {' or '.join(repr(c) for c in close)}?" if close else \
        "this botocore knows no such region (a new one may need a newer boto3)"
    raise ConfigError("region", "an AWS region such as 'us-east-1' (one botocore knows for EC2)", name, detail=detail)


def aws_code(error: BaseException) -> str:
    """AWS's error code kept on a translated error (``""`` if none)."""
    return error.code if isinstance(error, ProvisionError) else ""


class EC2:
    """One region's EC2 (and SSM, for AMI parameters) clients with translated errors.

    Build with :meth:`connect`; a ``session`` (``boto3.Session``) may be given, so profiles,
    SSO and event hooks registered on it apply to every call.
    """

    def __init__(self, client: Any, *, ssm: Any = None, region: str = ""):
        self.client = client
        self._ssm = ssm
        self.region = region or getattr(getattr(client, "meta", None), "region_name", "") or ""

    @classmethod
    def connect(cls, region: str | None = None, *, session: Any = None, profile: str | None = None) -> EC2:
        """Clients for ``region`` (default: the session's region). Raises ConfigError when no region."""
        boto3 = require("boto3", "sky.AWS")
        Config = require("botocore.config", "sky.AWS").Config
        BotoCoreError = require("botocore.exceptions", "sky.AWS").BotoCoreError

        config = Config(retries={"mode": "standard", "max_attempts": 5}, connect_timeout=10, read_timeout=60,
                        user_agent_extra="skyward")
        try:
            if session is None:
                session = boto3.Session(profile_name=profile)
            name = region or session.region_name
            if not name:
                raise ConfigError("region", "an AWS region such as 'us-east-1' (region=, AWS_DEFAULT_REGION "
                                  "or ~/.aws/config)", None)
            check_region(session, name)
            ec2 = session.client("ec2", region_name=name, config=config)
            ssm = session.client("ssm", region_name=name, config=config)
        except BotoCoreError as exc:
            raise translate(exc, "connect") from exc
        return cls(ec2, ssm=ssm, region=name)

    def call(self, operation: str, request: Mapping[str, Any] | None = None, *, instance_type: str = "",
             zone: str = "") -> dict[str, Any]:
        """``client.<operation>(**request)``; botocore errors become :mod:`skyward.errors` types."""
        with translated(operation, instance_type=instance_type, zone=zone, region=self.region):
            return getattr(self.client, operation)(**dict(request or {}))

    def pages(self, operation: str, request: Mapping[str, Any] | None = None) -> Iterator[dict[str, Any]]:
        """Every page of a paginated call, translated."""
        with translated(operation, region=self.region):
            paginator = self.client.get_paginator(operation)
            yield from paginator.paginate(**dict(request or {}))

    def ssm_parameter(self, name: str) -> str:
        """The value of an SSM parameter (public AMI parameters live there)."""
        if self._ssm is None:
            raise ProvisionError("no SSM client to resolve AMI parameters", provider="aws")
        with translated("ssm:GetParameter", region=self.region):
            return str(self._ssm.get_parameter(Name=name)["Parameter"]["Value"])


# -- finding and removing a pool's resources ---------------------------------------------------------
