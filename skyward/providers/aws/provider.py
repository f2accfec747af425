"""The AWS provider: EC2 instances for a pool, described so that the pool reaches them over SSH.

What :class:`AWS` does for a pool, in order (every step before the launch only reads):

1. **Plan** (:meth:`AWS.plan`, also run by ``validate`` when the pool is made): the instance
   types that fit the request, cheapest first (``describe_instance_types``, with the bundled
   catalog as fallback), the AMI (SSM public parameters unless ``ami`` is given), and the
   subnets — one per availability zone — that a launch may use.
2. **Per-pool resources**: an ed25519 key pair made here (only the public half is sent to
   AWS; the private half is written 0600 in a 0700 temporary directory and deleted with the
   pool), a pool host key (so the client verifies the machines it connects to), and a
   security group allowing SSH from ``ssh_cidr`` only and all traffic between its members.
   Everything is tagged ``skyward:pool=<pool id>``.
3. **Launch**: one ``RunInstances`` for all nodes (one subnet, so one AZ; all or none), with
   the watchdog user data of :mod:`skyward.providers.aws.watchdog` and
   ``InstanceInitiatedShutdownBehavior=terminate``. ``allocation="spot-if-available"`` tries
   spot in each AZ, then on-demand; a refusal for capacity or quota moves on to the next
   AZ, then the next-cheapest type (up to :data:`FALLBACK_TYPES`). Strict allocations try
   only their market and raise :class:`~skyward.errors.CapacityError` naming the type, AZ
   and AWS's message.
4. **Describe**: each instance carries its SSH address (the pool's key and host key) and its
   environment settings; the pool reaches and prepares it exactly as an SSH host, retrying
   the first connection while the machine boots (``boot_timeout``).
5. **Release**: terminate, confirm (every instance shutting down or terminated), delete the
   key pair and the security group, all found by tag — also after a failed or interrupted
   launch, whose instances may be known only to AWS.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import sys
import tempfile
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from skyward._retry import Backoff
from skyward.errors import CapacityError, ConfigError, ProvisionError
from skyward.providers.aws import catalog, watchdog
from skyward.providers.aws import ec2 as api
from skyward.providers.aws.keys import new_key_pair, public_key_of, write_private
from skyward.providers.aws.plan import LaunchPlan, MachineImage, Placement
from skyward.providers.base import HostEnvironment, Instance, PoolSpec, Provider, SSHAddress

__all__ = [
    "ALLOCATIONS",
    "AWS",
    "DLAMI_PARAMETER",
    "FALLBACK_TYPES",
    "IP_LOOKUP_URL",
    "UBUNTU_PARAMETER",
    "LaunchPlan",
    "Placement",
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
#: Where the client's public IPv4 address is looked up when ``ssh_cidr`` is not given
#: (an AWS endpoint that answers with the caller's address as plain text).
IP_LOOKUP_URL = "https://checkip.amazonaws.com"
ALLOCATIONS = ("spot-if-available", "spot", "on-demand")
#: How many of the cheapest fitting instance types a launch may fall back to.
FALLBACK_TYPES = 3
Allocation = Literal["spot-if-available", "spot", "on-demand"]

# (region, endpoint, arch) -> (instance types, where they came from); see AWS._instance_types.
_TYPES: dict[tuple[str, str, str | None], tuple[tuple[catalog.InstanceType, ...], str]] = {}
_TYPES_LOCK = threading.Lock()


# -- one pool's state -----------------------------------------------------------------------------


@dataclass
class _Pool:
    pool_id: str
    plan: LaunchPlan
    directory: str = ""  # private temp dir: the pool's private key and known_hosts
    key_path: str = ""
    instances: list[Instance] = field(default_factory=list)
    summary: str = ""  # "spot g5.xlarge in us-east-1a"
    launch_in_flight: bool = False  # a RunInstances whose outcome is unknown


# -- helpers ----------------------------------------------------------------------------------------


def _lookup_public_ip(url: str, timeout: float = 5.0) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - a fixed https URL
        return str(ipaddress.ip_address(response.read(64).decode().strip()))


# -- the provider -----------------------------------------------------------------------------------


class AWS(Provider):
    """EC2 instances for a pool: chosen by accelerator, launched spot-first, always cleaned up.

    >>> import skyward as sky
    >>> with sky.ComputePool(provider=sky.AWS(region="us-east-1"), accelerator="A100",
    ...                      nodes=4, plugins=[sky.plugins.torch()]) as pool:  # doctest: +SKIP
    ...     ...

    Args:
        region: the AWS region (default: the session's, e.g. ``AWS_DEFAULT_REGION``).
        instance_type: launch exactly this type (e.g. ``"g5.xlarge"``) instead of choosing.
        vcpus, memory_gb: minimum vCPUs / GiB of RAM per node (CPU pools choose by these).
        arch: ``"x86_64"`` (default), ``"arm64"``, or ``None`` for either.
        allocation: ``"spot-if-available"`` (spot, falling back to on-demand when spot is
            refused for capacity or quota), ``"spot"`` or ``"on-demand"`` (strict).
        ami: an AMI id, or ``"resolve:ssm:<parameter>"``; default: the Deep Learning base AMI
            (NVIDIA drivers) for CUDA types, Ubuntu 24.04 LTS otherwise (:data:`DLAMI_PARAMETER`,
            :data:`UBUNTU_PARAMETER`).
        subnet_id: launch into this subnet (its AZ and VPC); default: the default VPC's subnets.
        public_ip: give instances a public address (``None``: the subnet's setting).
        disk_gb: root volume size (at least the AMI's own size); always encrypted (EBS).
        idle_timeout: seconds without the client's SSH connection after which an instance
            powers itself off (and so is terminated).
        max_lifetime: seconds after boot at which an instance powers off regardless
            (``None``: no limit — only if you watch your bill).
        user: the SSH login user of the AMI.
        ssh_key: a private key file to log in with instead of a fresh per-pool key (its public
            key is still imported as the pool's key pair).
        known_hosts: known_hosts file(s) to verify hosts against, for AMIs whose host keys you
            know; default: a host key made for the pool and installed at boot.
        ssh_cidr: the addresses SSH is allowed from (``"203.0.113.7/32"``); default: this
            client's public address, looked up at ``ip_lookup_url``. Every address
            (``"0.0.0.0/0"``, ``"::/0"``) is refused unless ``allow_ssh_from_anywhere=True``.
        allow_ssh_from_anywhere: the explicit opt-in for an ``ssh_cidr`` of every address.
        ssh_via: connect to the ``"public"`` or ``"private"`` address; ``"auto"``: public
            when the instance has one.
        root, find_links, no_index, bootstrap_timeout: as for :class:`~skyward.SSH`.
        boot_timeout: seconds for instances to run and answer on SSH.
        session: a ``boto3.Session`` to use (profiles, SSO, hooks); or ``profile``: its name.

    Raises :class:`~skyward.ConfigError` naming the parameter for invalid input — when made,
    and (with the region's offer) when the pool is made, before anything is launched.
    """

    name = "aws"

    def __init__(
        self,
        region: str | None = None,
        *,
        instance_type: str | None = None,
        vcpus: int | None = None,
        memory_gb: float | None = None,
        arch: str | None = "x86_64",
        allocation: Allocation = "spot-if-available",
        ami: str | None = None,
        subnet_id: str | None = None,
        public_ip: bool | None = None,
        disk_gb: int = 100,
        idle_timeout: float = 600.0,
        max_lifetime: float | None = 24 * 3600.0,
        user: str = "ubuntu",
        ssh_key: str | os.PathLike[str] | None = None,
        known_hosts: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None,
        ssh_cidr: str | None = None,
        allow_ssh_from_anywhere: bool = False,
        ip_lookup_url: str = IP_LOOKUP_URL,
        ssh_via: Literal["auto", "public", "private"] = "auto",
        root: str = "~/.skyward",
        find_links: Sequence[str] = (),
        no_index: bool = False,
        boot_timeout: float = 600.0,
        bootstrap_timeout: float = 1800.0,
        connect_timeout: float = 10.0,
        session: Any = None,
        profile: str | None = None,
    ):
        from skyward.providers.aws._options import aws_options

        o = aws_options(region=region, instance_type=instance_type, vcpus=vcpus, memory_gb=memory_gb, arch=arch,
                        allocation=allocation, ami=ami, subnet_id=subnet_id, public_ip=public_ip, disk_gb=disk_gb,
                        idle_timeout=idle_timeout, max_lifetime=max_lifetime, user=user, known_hosts=known_hosts,
                        ssh_cidr=ssh_cidr, allow_ssh_from_anywhere=allow_ssh_from_anywhere,
                        ip_lookup_url=ip_lookup_url, ssh_via=ssh_via, root=root,
                        find_links=find_links, no_index=no_index, boot_timeout=boot_timeout,
                        bootstrap_timeout=bootstrap_timeout, connect_timeout=connect_timeout, session=session,
                        profile=profile)
        self.ssh_key: str | None = None
        self._public_key: str | None = None
        if ssh_key is not None:
            from skyward.providers.ssh import key_file

            self.ssh_key = key_file("ssh_key", ssh_key)
            self._public_key = public_key_of(self.ssh_key)
        self.known_hosts: tuple[str, ...] | None = None
        if o.known_hosts is not None:
            self.known_hosts = tuple(os.path.expanduser(p) for p in o.known_hosts)
            for path in self.known_hosts:
                if not os.path.isfile(path):
                    raise ConfigError("known_hosts", "existing known_hosts files", path, detail="not found")

        if o.region is not None:  # a typo fails here, not as whatever an unknown endpoint answers
            import botocore.session

            api.check_region(botocore.session.get_session(), o.region)
        self.region = o.region
        self.instance_type = o.instance_type
        self.vcpus = o.vcpus
        self.memory_gb = o.memory_gb
        self.arch = o.arch
        self.allocation: Allocation = o.allocation
        self.ami = o.ami
        self.subnet_id = o.subnet_id
        self.public_ip = o.public_ip
        self.disk_gb = o.disk_gb
        self.idle_timeout = o.idle_timeout
        self.max_lifetime = o.max_lifetime
        self.user = o.user
        self.ssh_cidr = o.ssh_cidr
        self.ip_lookup_url = o.ip_lookup_url
        self.ssh_via = o.ssh_via
        self.root = o.root
        self.find_links = o.find_links
        self.no_index = o.no_index
        self.boot_timeout = o.boot_timeout
        self.bootstrap_timeout = o.bootstrap_timeout
        self.connect_timeout = o.connect_timeout
        self.session = o.session
        self.profile = o.profile
        #: Seconds to wait before sweeping again for instances of an interrupted launch.
        self.cleanup_settle = 3.0
        #: Seconds teardown may take (instances must finish terminating before the security
        #: group can be deleted).
        self.teardown_timeout = 300.0

        self._lock = threading.Lock()
        self._client: api.EC2 | None = None
        self._plans: dict[str, LaunchPlan] = {}
        self._pools: dict[str, _Pool] = {}
        self._owner: dict[str, str] = {}  # instance id -> pool id

    # -- AWS access ------------------------------------------------------------------------------
    def _ec2(self) -> api.EC2:
        with self._lock:
            if self._client is None:
                self._client = api.EC2.connect(self.region, session=self.session, profile=self.profile)
            return self._client

    def _instance_types(self, ec2: api.EC2) -> tuple[tuple[catalog.InstanceType, ...], str]:
        """Every type the region offers (EC2 API), or the bundled catalog when the API says no.

        The answer is kept for the life of the process: instance specs do not change.
        """
        filters = [] if self.arch is None else [{"Name": "processor-info.supported-architecture",
                                                 "Values": [self.arch]}]
        key = (ec2.region, getattr(getattr(ec2.client, "meta", None), "endpoint_url", ""), self.arch)
        with _TYPES_LOCK:
            found = _TYPES.get(key)
            if found is not None:
                return found
            try:
                types = tuple(catalog.from_ec2_description(item)
                              for page in ec2.pages("describe_instance_types", {"Filters": filters})
                              for item in page.get("InstanceTypes", []))
                found = (types, "ec2-api") if types else (catalog.load_catalog(), "catalog")
                _TYPES[key] = found
            except ProvisionError as exc:  # e.g. an IAM policy without ec2:DescribeInstanceTypes
                found = (catalog.load_catalog(), f"catalog (describe_instance_types: {exc})")
            return found

    def _choose(self, types: Sequence[catalog.InstanceType], spec: PoolSpec) -> list[catalog.InstanceType]:
        if self.instance_type is not None:
            found = next((t for t in types if t.name == self.instance_type), None) or catalog.by_name(self.instance_type)
            if found is None:
                raise ConfigError("instance_type", "an instance type offered in this region", self.instance_type)
            if spec.accelerator is not None:
                catalog.select([found], accelerator=spec.accelerator)  # raises naming "accelerator"
            return [found]
        return catalog.select(types, accelerator=spec.accelerator, vcpus=self.vcpus, memory_gb=self.memory_gb,
                              arch=self.arch)

    def _placements(self, ec2: api.EC2) -> tuple[Placement, ...]:
        if self.subnet_id is not None:
            try:
                subnets = ec2.call("describe_subnets", {"SubnetIds": [self.subnet_id]}).get("Subnets", [])
            except ProvisionError as exc:
                if not api.aws_code(exc).startswith("InvalidSubnetID"):
                    raise
                subnets = []
            if not subnets:
                raise ConfigError("subnet_id", "a subnet in this region", self.subnet_id)
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

    def _zones(self, ec2: api.EC2, names: Sequence[str]) -> dict[str, tuple[str, ...]]:
        if self.subnet_id is not None:
            return {}  # one subnet: RunInstances itself says if the type is not offered there
        try:
            offers = [o for page in ec2.pages("describe_instance_type_offerings", {
                "LocationType": "availability-zone", "Filters": [{"Name": "instance-type", "Values": list(names)}]})
                for o in page.get("InstanceTypeOfferings", [])]
        except ProvisionError:
            return {}
        zones: dict[str, list[str]] = {}
        for offer in offers:
            zones.setdefault(offer["InstanceType"], []).append(offer["Location"])
        return {name: tuple(sorted(z)) for name, z in zones.items()}

    def _image(self, ec2: api.EC2, arch: str, cuda: bool) -> MachineImage:
        if self.ami is None:
            parameter = (DLAMI_PARAMETER.format(arch=arch) if cuda
                         else UBUNTU_PARAMETER.format(arch=_UBUNTU_ARCH.get(arch, arch)))
            image_id, source = ec2.ssm_parameter(parameter), f"ssm:{parameter}"
        elif self.ami.startswith("resolve:ssm:"):
            parameter = self.ami[len("resolve:ssm:"):]
            image_id, source = ec2.ssm_parameter(parameter), f"ssm:{parameter}"
        else:
            image_id, source = self.ami, "ami"
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

    def plan(self, spec: PoolSpec) -> LaunchPlan:
        """What a launch for ``spec`` would do, resolved with read-only calls; nothing is created.

        Raises ConfigError (naming the parameter) when the request cannot be met here.
        """
        if not isinstance(spec.nodes, int) or spec.nodes < 1:
            raise ConfigError("nodes", "an integer >= 1", spec.nodes)
        ec2 = self._ec2()
        types, source = self._instance_types(ec2)
        candidates = self._choose(types, spec)[:FALLBACK_TYPES]
        placements = self._placements(ec2)
        zones = self._zones(ec2, [t.name for t in candidates])
        images = {}
        for t in candidates:
            if (t.arch, t.cuda) not in images:
                images[(t.arch, t.cuda)] = self._image(ec2, t.arch, t.cuda)
        by_allocation: dict[str, tuple[api.Market, ...]] = {
            "spot-if-available": ("spot", "on-demand"), "spot": ("spot",), "on-demand": ("on-demand",)}
        markets = by_allocation[self.allocation]
        return LaunchPlan(spec.pool_id, spec.nodes, ec2.region, tuple(candidates), placements, markets,
                          images, zones, source)

    # -- the provider contract -----------------------------------------------------------------
    def validate(self, spec: PoolSpec) -> None:
        """Resolve the launch plan now, so a request AWS cannot serve fails before any launch."""
        try:
            plan = self.plan(spec)
        except ConfigError:
            raise
        except ProvisionError:
            # AWS unreachable right now: check what can be checked offline; provision will
            # try again (and say what is wrong).
            self._choose(catalog.load_catalog(), spec)
            return
        with self._lock:
            self._plans[spec.pool_id] = plan

    def provision(self, spec: PoolSpec) -> list[Instance]:
        """Launch ``spec.nodes`` instances and return them, or clean up everything and raise."""
        with self._lock:
            plan = self._plans.pop(spec.pool_id, None)
        if plan is None or plan.nodes != spec.nodes:
            plan = self.plan(spec)
        pool = _Pool(spec.pool_id, plan)
        with self._lock:
            self._pools[spec.pool_id] = pool
        try:
            return self._provision(pool)
        except BaseException as exc:
            self._clean_up_failed(pool, exc)
            raise

    def _provision(self, pool: _Pool) -> list[Instance]:
        ec2 = self._ec2()
        plan = pool.plan
        ssh_cidr = self._resolve_ssh_cidr()
        pool.directory = tempfile.mkdtemp(prefix=f"skyward-aws-{pool.pool_id}-")  # mode 0700
        if self.ssh_key is not None:
            pool.key_path, public = self.ssh_key, self._public_key or ""
        else:
            private, public = new_key_pair()
            pool.key_path = write_private(pool.directory, "id_ed25519", private)
        host_key = None
        if self.known_hosts is None:
            host_private, host_public = new_key_pair()
            host_key = watchdog.HostKey("ed25519", host_public, host_private)

        key_name = api.resource_name(pool.pool_id)
        ec2.call("import_key_pair", api.key_pair_request(pool.pool_id, public))
        group_id = ec2.call("create_security_group", api.security_group_request(pool.pool_id, plan.vpc_id))["GroupId"]
        ec2.call("authorize_security_group_ingress", api.ingress_request(group_id, ssh_cidr))
        user_data = watchdog.user_data(idle_timeout=self.idle_timeout, max_lifetime=self.max_lifetime,
                                       host_key=host_key)

        described = self._launch(ec2, pool, group_id, key_name, user_data)
        itype = next(t for t in plan.candidates if t.name == described[0]["InstanceType"])
        known: tuple[str, ...] = self.known_hosts or ()
        if host_key is not None:
            addrs = [self._connect_address(i["InstanceId"], i.get("PrivateIpAddress") or "",
                                           i.get("PublicIpAddress") or None) for i in described]
            lines = "".join(f"{addr} {host_key.public}\n" for addr in dict.fromkeys(addrs))
            known = (write_private(pool.directory, "known_hosts", lines),)
        environment = HostEnvironment(
            root=self.root, find_links=self.find_links, no_index=self.no_index,
            bootstrap_timeout=self.bootstrap_timeout, reach_timeout=self.boot_timeout,
            # Stock AMIs rarely ship the client's Python version: let uv download it (unless
            # the image says otherwise).
            env={"UV_PYTHON_DOWNLOADS": "automatic"})
        instances = []
        for node, item in enumerate(described):
            private_ip = item.get("PrivateIpAddress") or ""
            public_ip = item.get("PublicIpAddress") or None
            address = self._connect_address(item["InstanceId"], private_ip, public_ip)
            instances.append(Instance(
                id=item["InstanceId"], node=node, private_addr=private_ip, public_addr=public_ip,
                accelerators=itype.gpu_count,
                ssh=SSHAddress(address, self.user, key=pool.key_path, known_hosts=known,
                               connect_timeout=self.connect_timeout),
                environment=replace(environment, note=f"{pool.summary}: {item['InstanceId']} at {private_ip}")))
        for inst in instances:
            ec2.call("create_tags", {"Resources": [inst.id], "Tags": [{"Key": api.TAG_NODE, "Value": str(inst.node)}]})
        pool.instances = instances
        with self._lock:
            for inst in instances:
                self._owner[inst.id] = pool.pool_id
        return instances

    def _connect_address(self, instance_id: str, private_ip: str, public_ip: str | None) -> str:
        if self.ssh_via == "private" or (self.ssh_via == "auto" and not public_ip):
            if not private_ip:
                raise ProvisionError(f"instance {instance_id} has no private address", provider="aws")
            return private_ip
        if not public_ip:
            raise ProvisionError(f"instance {instance_id} has no public address; pass public_ip=True, "
                                 "or ssh_via='private' when this client is inside the VPC", provider="aws")
        return public_ip

    def _resolve_ssh_cidr(self) -> str:
        if self.ssh_cidr is not None:
            return self.ssh_cidr
        try:
            address = _lookup_public_ip(self.ip_lookup_url)
        except (OSError, ValueError) as exc:
            raise ConfigError("ssh_cidr", "this client's public address as a range, e.g. '203.0.113.7/32'", None,
                              detail=f"could not look it up at {self.ip_lookup_url}: {exc}") from None
        return f"{address}/{32 if ':' not in address else 128}"

    def _launch(self, ec2: api.EC2, pool: _Pool, group_id: str, key_name: str,
                user_data: str) -> list[Mapping[str, Any]]:
        """Try the plan's attempts in order; return the running instances' descriptions by node."""
        plan = pool.plan
        refusals: list[str] = []
        last: tuple[str, str] = ("", "")
        for n, (itype, place, market) in enumerate(plan.attempts()):
            image = plan.image_for(itype)
            disk = max(self.disk_gb, image.min_disk_gb)
            request = api.run_instances_request(
                pool_id=pool.pool_id, count=plan.nodes, instance_type=itype.name, image_id=image.image_id,
                subnet_id=place.subnet_id, group_id=group_id, key_name=key_name, market=market,
                user_data=user_data, client_token=f"skyward-{pool.pool_id}-{n}-{uuid.uuid4().hex[:8]}",
                root_device=image.root_device, disk_gb=disk, public_ip=self.public_ip)
            last = (itype.name, place.zone)
            pool.launch_in_flight = True
            try:
                answer = ec2.call("run_instances", request, instance_type=itype.name, zone=place.zone)
            except CapacityError as exc:
                pool.launch_in_flight = False
                refusals.append(f"{market} {itype.name} in {place.zone}: {exc}")
                continue
            except ProvisionError as exc:
                if api.aws_code(exc):  # AWS answered with an error: nothing was launched
                    pool.launch_in_flight = False
                raise
            pool.launch_in_flight = False
            ids = [i["InstanceId"] for i in answer.get("Instances", [])]
            if len(ids) != plan.nodes:
                refusals.append(f"{market} {itype.name} in {place.zone}: EC2 started {len(ids)} of {plan.nodes}")
                self._give_up_attempt(ec2, pool, ids)
                continue
            running, problem = self._wait_running(ec2, ids)
            if problem:
                refusals.append(f"{market} {itype.name} in {place.zone}: {problem}")
                self._give_up_attempt(ec2, pool, ids)
                continue
            pool.summary = f"{market} {itype.name} in {place.zone}"
            if refusals:
                pool.summary += f" (after: {refusals[-1]})"
            by_index = sorted(running, key=lambda item: (item.get("AmiLaunchIndex", 0), item["InstanceId"]))
            return by_index
        shown = refusals[-8:]
        more = f"\n  ... and {len(refusals) - len(shown)} earlier" if len(refusals) > len(shown) else ""
        raise CapacityError(f"no {self.allocation} capacity for {plan.nodes} node(s); AWS answered:{more}\n  "
                            + "\n  ".join(shown), provider="aws", instance_type=last[0], zone=last[1])

    def _give_up_attempt(self, ec2: api.EC2, pool: _Pool, ids: Sequence[str]) -> None:
        """Terminate a failed attempt's instances: those EC2 named, and any other of the pool's
        (an answer may have been incomplete); nothing of the pool runs before the next attempt."""
        tagged = [i.id for i in api.list_resources(ec2, pool.pool_id).live_instances]
        left = api.terminate(ec2, list(dict.fromkeys([*ids, *tagged])), timeout=self.teardown_timeout)
        if left:
            raise ProvisionError(f"could not confirm the termination of {', '.join(left)}", provider="aws")

    def _wait_running(self, ec2: api.EC2, ids: Sequence[str]) -> tuple[list[Mapping[str, Any]], str]:
        """Wait until every instance runs with a private address: (descriptions, "") or ([], why not)."""
        ready: list[Mapping[str, Any]] = []
        for _ in Backoff(timeout=self.boot_timeout, delay=0.2, max_delay=3.0):
            states = api.instance_states(ec2, ids)
            for item in states.values():
                state = item.get("State", {}).get("Name")
                if state in api.GONE_STATES or state == "stopped":
                    reason = item.get("StateReason", {}).get("Message") or state
                    return [], f"{item['InstanceId']} went {state} while starting ({reason})"
            ready = [states[i] for i in ids if i in states and states[i].get("State", {}).get("Name") == "running"
                     and states[i].get("PrivateIpAddress")]
            if len(ready) == len(ids):
                return ready, ""
        raise ProvisionError(f"instances not running after {self.boot_timeout:g}s: "
                             + ", ".join(i for i in ids if i not in {r['InstanceId'] for r in ready}),
                             provider="aws")

    def terminate(self, instances: list[Instance]) -> None:
        """Release every pool these instances belong to, by tag, and confirm it."""
        with self._lock:
            ids = list(dict.fromkeys(self._owner[i.id] for i in instances if i.id in self._owner))
            pools = [self._pools[p] for p in ids if p in self._pools]
        problems = []
        for pool in pools:
            left = self._release(pool, settle=0.0)
            if left is not None and not left.empty:
                problems.append(f"pool {pool.pool_id}: not released: {left.describe()}; "
                                f"run `skyward down {pool.pool_id} --region {pool.plan.region}`")
        if problems:
            raise ProvisionError("; ".join(problems), provider="aws")

    def _release(self, pool: _Pool, *, settle: float) -> api.PoolResources | None:
        """Destroy the pool's tagged resources, forget it, drop its private files."""
        left = api.destroy(self._ec2(), pool.pool_id, timeout=self.teardown_timeout, settle=settle)
        if left.empty:
            with self._lock:
                self._pools.pop(pool.pool_id, None)
                for inst in pool.instances:
                    self._owner.pop(inst.id, None)
            if pool.directory:
                shutil.rmtree(pool.directory, ignore_errors=True)
        return left

    def _clean_up_failed(self, pool: _Pool, error: BaseException) -> None:
        """After a failed or interrupted launch: remove everything, even on a second Ctrl-C."""
        outcome: list[Any] = []

        def work() -> None:
            try:
                outcome.append(self._release(pool, settle=self.cleanup_settle if pool.launch_in_flight else 0.0))
            except BaseException as exc:  # reported below, on the caller's thread
                outcome.append(exc)

        worker = threading.Thread(target=work, name=f"skyward-aws-cleanup-{pool.pool_id}", daemon=True)
        worker.start()
        for _ in range(3):
            try:
                worker.join()
                break
            except KeyboardInterrupt:
                print(f"skyward: removing the AWS resources of pool {pool.pool_id}, please wait...",
                      file=sys.__stderr__)
        region = pool.plan.region
        done = outcome[0] if outcome else None
        if isinstance(done, api.PoolResources) and done.empty:
            return
        what = done.describe() if isinstance(done, api.PoolResources) else repr(done)
        with contextlib.suppress(Exception):
            error.add_note(f"skyward: cleanup of pool {pool.pool_id} incomplete ({what}); "
                           f"run `skyward down {pool.pool_id} --region {region}`")

    def __repr__(self) -> str:
        shown = [repr(self.region)] if self.region else []
        if self.instance_type:
            shown.append(f"instance_type={self.instance_type!r}")
        if self.allocation != "spot-if-available":
            shown.append(f"allocation={self.allocation!r}")
        return f"AWS({', '.join(shown)})"
