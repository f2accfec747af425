"""Planning an AWS launch: everything it needs, resolved before anything is created.

:func:`plan_launch` makes a :class:`LaunchPlan` with read-only calls only: the instance types
that fit the request, cheapest first (``describe_instance_types``, with the bundled catalog as
fallback; :func:`instance_types`, :func:`choose`), the subnets — one per availability zone —
that a launch may use (:func:`placements`, :func:`zones`), and the AMI for each kind of type
(:func:`machine_image`: SSM public parameters unless ``ami`` is given).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from skyward.errors import ConfigError, ProvisionError
from skyward.providers.aws import catalog
from skyward.providers.aws import ec2 as api
from skyward.providers.base import PoolSpec

__all__ = [
    "DLAMI_PARAMETER",
    "FALLBACK_TYPES",
    "UBUNTU_PARAMETER",
    "LaunchPlan",
    "MachineImage",
    "Placement",
    "choose",
    "instance_types",
    "machine_image",
    "placements",
    "plan_launch",
    "zones",
]

#: AWS Deep Learning Base OSS NVIDIA Driver GPU AMI (Ubuntu 22.04): NVIDIA driver and CUDA
#: preinstalled. Parameter from the DLAMI developer guide ("Query AMI-ID with AWSCLI",
#: https://docs.aws.amazon.com/dlami/latest/devguide/find-dlami-id.html); ``{arch}`` is
#: ``x86_64`` or ``arm64``.
DLAMI_PARAMETER = "/aws/service/deeplearning/ami/{arch}/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
#: Canonical's Ubuntu 24.04 LTS server image; parameter layout documented by Canonical
#: ("Finding Ubuntu images with the AWS SSM Parameter Store",
#: https://documentation.ubuntu.com/aws/en/latest/aws-how-to/instances/find-ubuntu-images/);
#: ``{arch}`` is ``amd64`` or ``arm64``.
UBUNTU_PARAMETER = "/aws/service/canonical/ubuntu/server/24.04/stable/current/{arch}/hvm/ebs-gp3/ami-id"
_UBUNTU_ARCH = {"x86_64": "amd64", "arm64": "arm64"}
#: How many of the cheapest fitting instance types a launch may fall back to.
FALLBACK_TYPES = 3

# (region, endpoint, arch) -> (instance types, where they came from); see instance_types.
_TYPES: dict[tuple[str, str, str | None], tuple[tuple[catalog.InstanceType, ...], str]] = {}
_TYPES_LOCK = threading.Lock()


@dataclass(frozen=True, slots=True)
class Placement:
    """A subnet a pool may launch into, and the AZ and VPC it belongs to."""

    subnet_id: str
    zone: str
    vpc_id: str


@dataclass(frozen=True, slots=True)
class MachineImage:
    """A resolved AMI: its id, where it came from, its root device and minimal size."""

    image_id: str
    source: str
    root_device: str | None = None
    min_disk_gb: int = 0


@dataclass(frozen=True)
class LaunchPlan:
    """Everything a launch needs, resolved without creating anything (see :meth:`AWS.plan`).

    ``candidates`` are the instance types to try, best first; ``zones`` says, per type, the
    AZs that offer it (a type missing from it: every placement); ``images`` maps
    ``(arch, cuda)`` to an AMI; ``types_source`` says whether the types came from the EC2 API
    or the bundled catalog.
    """

    pool_id: str
    nodes: int
    region: str
    candidates: tuple[catalog.InstanceType, ...]
    placements: tuple[Placement, ...]
    markets: tuple[api.Market, ...]
    images: Mapping[tuple[str, bool], MachineImage]
    zones: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    types_source: str = "ec2-api"
    #: Devices per node the pool asked for (a type may have more: the nodes use this many).
    accelerators: int | None = None

    @property
    def vpc_id(self) -> str:
        return self.placements[0].vpc_id

    def image_for(self, itype: catalog.InstanceType) -> MachineImage:
        return self.images[(itype.arch, itype.cuda)]

    def attempts(self) -> Iterator[tuple[catalog.InstanceType, Placement, api.Market]]:
        """Launch attempts in order: per type, each market across the AZs that offer the type."""
        for itype in self.candidates:
            offered = self.zones.get(itype.name)
            places = [p for p in self.placements if offered is None or p.zone in offered]
            for market in self.markets:
                for place in places:
                    yield itype, place, market

    def describe(self) -> str:
        """A few human lines: what would be launched where."""
        first = self.candidates[0]
        lines = [f"{self.nodes} x {first.describe()} in {self.region} "
                 f"({' then '.join(self.markets)}; types from {self.types_source})"]
        if len(self.candidates) > 1:
            lines.append("  fallback types: " + ", ".join(t.name for t in self.candidates[1:]))
        lines.append("  zones: " + ", ".join(f"{p.zone} ({p.subnet_id})" for p in self.placements))
        for (arch, cuda), image in sorted(self.images.items()):
            lines.append(f"  image for {arch}{' + CUDA' if cuda else ''}: {image.image_id} ({image.source})")
        return "\n".join(lines)


# -- planning: read-only calls ----------------------------------------------------------------------


def instance_types(ec2: api.EC2, arch: str | None) -> tuple[tuple[catalog.InstanceType, ...], str]:
    """Every type the region offers (EC2 API), or the bundled catalog when the API says no.

    Returns the types and where they came from. The answer is kept for the life of the
    process: instance specs do not change.
    """
    filters = [] if arch is None else [{"Name": "processor-info.supported-architecture", "Values": [arch]}]
    key = (ec2.region, getattr(getattr(ec2.client, "meta", None), "endpoint_url", ""), arch)
    with _TYPES_LOCK:
        found = _TYPES.get(key)
        if found is not None:
            return found
        try:
            types = tuple(catalog.from_ec2_description(item)
                          for page in ec2.pages("describe_instance_types", {"Filters": filters})
                          for item in page.get("InstanceTypes", []))
            found = (_priced(types, ec2.region), "ec2-api") if types else (catalog.load_catalog(), "catalog")
            _TYPES[key] = found
        except ProvisionError as exc:  # e.g. an IAM policy without ec2:DescribeInstanceTypes
            found = (catalog.load_catalog(), f"catalog (describe_instance_types: {exc})")
        return found


def _priced(types: tuple[catalog.InstanceType, ...], region: str) -> tuple[catalog.InstanceType, ...]:
    """The types with the region's cached prices (``skyward catalog refresh``), where there are any."""
    from dataclasses import replace

    from skyward.providers.aws import catalog_cache

    prices = {t.name: t.price_per_hour for t in catalog_cache.current(region)[0] if t.price_per_hour is not None}
    return tuple(replace(t, price_per_hour=prices.get(t.name, t.price_per_hour)) for t in types)


def choose(types: Sequence[catalog.InstanceType], spec: PoolSpec, *, instance_type: str | None,
           vcpus: int | None, memory_gb: float | None, arch: str | None) -> list[catalog.InstanceType]:
    """The types that serve ``spec``, best first: exactly ``instance_type`` when given.

    Raises ConfigError naming the parameter when none does. No I/O.
    """
    if instance_type is not None:
        found = next((t for t in types if t.name == instance_type), None) or catalog.by_name(instance_type)
        if found is None:
            raise ConfigError("instance_type", "an instance type offered in this region", instance_type)
        if spec.accelerator is not None:
            catalog.select([found], accelerator=spec.accelerator)  # raises naming "accelerator"
        return [found]
    return catalog.select(types, accelerator=spec.accelerator, vcpus=vcpus, memory_gb=memory_gb, arch=arch)


def placements(ec2: api.EC2, subnet_id: str | None) -> tuple[Placement, ...]:
    """``subnet_id``'s placement, or the default VPC's default subnets (one per AZ, by AZ)."""
    if subnet_id is not None:
        try:
            subnets = ec2.call("describe_subnets", {"SubnetIds": [subnet_id]}).get("Subnets", [])
        except ProvisionError as exc:
            if not api.aws_code(exc).startswith("InvalidSubnetID"):
                raise
            subnets = []
        if not subnets:
            raise ConfigError("subnet_id", "a subnet in this region", subnet_id)
        s = subnets[0]
        return (Placement(s["SubnetId"], s["AvailabilityZone"], s["VpcId"]),)
    vpcs = ec2.call("describe_vpcs", {"Filters": [{"Name": "is-default", "Values": ["true"]}]}).get("Vpcs", [])
    if not vpcs:
        raise ConfigError("subnet_id", "a subnet id (this region has no default VPC)", None)
    vpc = vpcs[0]["VpcId"]
    subnets = ec2.call("describe_subnets", {"Filters": [{"Name": "vpc-id", "Values": [vpc]},
                                                        {"Name": "default-for-az", "Values": ["true"]}]})
    places = sorted((Placement(s["SubnetId"], s["AvailabilityZone"], vpc) for s in subnets.get("Subnets", [])),
                    key=lambda p: p.zone)
    if not places:
        raise ConfigError("subnet_id", "a subnet id (the default VPC has no default subnets)", None)
    return tuple(places)


def zones(ec2: api.EC2, names: Sequence[str], subnet_id: str | None) -> dict[str, tuple[str, ...]]:
    """The AZs offering each of the types ``names`` (empty when unknown: every placement)."""
    if subnet_id is not None:
        return {}  # one subnet: RunInstances itself says if the type is not offered there
    try:
        offers = [o for page in ec2.pages("describe_instance_type_offerings", {
            "LocationType": "availability-zone", "Filters": [{"Name": "instance-type", "Values": list(names)}]})
            for o in page.get("InstanceTypeOfferings", [])]
    except ProvisionError:
        return {}
    found: dict[str, list[str]] = {}
    for offer in offers:
        found.setdefault(offer["InstanceType"], []).append(offer["Location"])
    return {name: tuple(sorted(z)) for name, z in found.items()}


def machine_image(ec2: api.EC2, ami: str | None, arch: str, cuda: bool) -> MachineImage:
    """The AMI for types of ``arch`` (with CUDA or not): ``ami`` when given, else the default's
    SSM parameter. Raises ConfigError naming ``ami`` when the image does not exist here."""
    if ami is None:
        parameter = (DLAMI_PARAMETER.format(arch=arch) if cuda
                     else UBUNTU_PARAMETER.format(arch=_UBUNTU_ARCH.get(arch, arch)))
        image_id, source = ec2.ssm_parameter(parameter), f"ssm:{parameter}"
    elif ami.startswith("resolve:ssm:"):
        parameter = ami[len("resolve:ssm:"):]
        image_id, source = ec2.ssm_parameter(parameter), f"ssm:{parameter}"
    else:
        image_id, source = ami, "ami"
    try:
        images = ec2.call("describe_images", {"ImageIds": [image_id]}).get("Images", [])
    except ProvisionError as exc:
        if not api.aws_code(exc).startswith("InvalidAMIID"):
            raise
        images = []
    if not images:
        raise ConfigError("ami", f"an AMI that exists in {ec2.region}", image_id, detail=f"from {source}")
    image = images[0]
    root = image.get("RootDeviceName")
    size = max((m.get("Ebs", {}).get("VolumeSize", 0) for m in image.get("BlockDeviceMappings", [])
                if m.get("DeviceName") == root), default=0)
    return MachineImage(image_id, source, root, int(size or 0))


_MARKETS: dict[str, tuple[api.Market, ...]] = {
    "spot-if-available": ("spot", "on-demand"), "spot": ("spot",), "on-demand": ("on-demand",)}


def plan_launch(ec2: api.EC2, spec: PoolSpec, *, instance_type: str | None, vcpus: int | None,
                memory_gb: float | None, arch: str | None, allocation: str, ami: str | None,
                subnet_id: str | None, zone: str | None = None) -> LaunchPlan:
    """What a launch for ``spec`` would do, resolved with read-only calls; nothing is created.

    ``zone`` keeps only that availability zone's subnet. Raises ConfigError (naming the
    parameter) when the request cannot be met here.
    """
    types, source = instance_types(ec2, arch)
    candidates = choose(types, spec, instance_type=instance_type, vcpus=vcpus, memory_gb=memory_gb,
                        arch=arch)[:FALLBACK_TYPES]
    places = placements(ec2, subnet_id)
    if zone is not None:
        inside = tuple(p for p in places if p.zone == zone)
        if not inside:
            raise ConfigError("zone", "an availability zone of the subnets here: " + ", ".join(p.zone for p in places),
                              zone)
        places = inside
    offered = zones(ec2, [t.name for t in candidates], subnet_id)
    images = {}
    for t in candidates:
        if (t.arch, t.cuda) not in images:
            images[(t.arch, t.cuda)] = machine_image(ec2, ami, t.arch, t.cuda)
    return LaunchPlan(spec.pool_id, spec.nodes, ec2.region, tuple(candidates), places, _MARKETS[allocation],
                      images, offered, source, spec.accelerator.count if spec.accelerator else None)
