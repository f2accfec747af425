"""The AWS provider: EC2 instances for a pool, described so that the pool reaches them over SSH.

What :class:`AWS` does for a pool, in order (every step before the launch only reads):

1. **Plan** (:meth:`AWS.plan`, also run by ``validate`` when the pool is made;
   :mod:`skyward.providers.aws.plan`): the instance types that fit the request, cheapest first
   (``describe_instance_types``, with the bundled catalog as fallback), the AMI (SSM public
   parameters unless ``ami`` is given), and the subnets — one per availability zone — that a
   launch may use.
2. **Per-pool resources** (:func:`~skyward.providers.aws.launch.create_access`): an ed25519
   key pair made here (only the public half is sent to AWS; the private half is written 0600
   in a 0700 temporary directory and deleted with the pool), a pool host key (so the client
   verifies the machines it connects to), and a security group allowing SSH from ``ssh_cidr``
   only and all traffic between its members. Everything is tagged ``skyward:pool=<pool id>``.
3. **Launch** (:func:`~skyward.providers.aws.launch.launch`): one ``RunInstances`` for all
   nodes (one subnet, so one AZ; all or none), with the watchdog user data of
   :mod:`skyward.providers.aws.watchdog` and ``InstanceInitiatedShutdownBehavior=terminate``.
   ``allocation="spot-if-available"`` tries spot in each AZ, then on-demand; a refusal for
   capacity or quota moves on to the next AZ, then the next-cheapest type (up to
   :data:`FALLBACK_TYPES`). Strict allocations try only their market and raise
   :class:`~skyward.errors.CapacityError` naming the type, AZ and AWS's message.
4. **Describe** (:mod:`skyward.providers.aws.describe`): each instance carries its SSH
   address (the pool's key and host key), its environment settings and its price as launched;
   the pool reaches and prepares it exactly as an SSH host, retrying the first connection
   while the machine boots (``boot_timeout``).
5. **Release** (:mod:`skyward.providers.aws.release`): terminate, confirm (every instance
   shutting down or terminated), delete the key pair and the security group, all found by tag
   — also after a failed or interrupted launch, whose instances may be known only to AWS.

A **named cluster** (``PoolSpec.cluster``) outlives its client, its provider pickled into its record:
see :mod:`skyward.providers.aws.machines`.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal

from skyward._optional import require
from skyward.errors import ConfigError, ProvisionError
from skyward.providers.aws import catalog, watchdog
from skyward.providers.aws import ec2 as api
from skyward.providers.aws import inventory, machines
from skyward.providers.aws.release import Releasing
from skyward.providers.aws.describe import connect_address, describe
from skyward.providers.aws.launch import PoolState, create_access, launch, resolve_ssh_cidr
from skyward.providers.aws.plan import (
    DLAMI_PARAMETER,
    FALLBACK_TYPES,
    UBUNTU_PARAMETER,
    LaunchPlan,
    Placement,
    choose,
    plan_launch,
)
from skyward.providers.base import Instance, PoolSpec, Provider

__all__ = ["ALLOCATIONS", "AWS", "DLAMI_PARAMETER", "FALLBACK_TYPES", "IP_LOOKUP_URL", "UBUNTU_PARAMETER",
           "LaunchPlan", "Placement"]

#: Where the client's public IPv4 address is looked up when ``ssh_cidr`` is not given
#: (an AWS endpoint that answers with the caller's address as plain text).
IP_LOOKUP_URL = "https://checkip.amazonaws.com"
ALLOCATIONS = ("spot-if-available", "spot", "on-demand")
#: ``max_lifetime``'s default (24 h). A named cluster has no hard lifetime unless
#: ``max_lifetime`` is given (this very object means "not given").
DEFAULT_MAX_LIFETIME = 24 * 3600.0
Allocation = Literal["spot-if-available", "spot", "on-demand"]


class AWS(Releasing, Provider):
    """EC2 instances for a pool: chosen by accelerator, launched spot-first, always cleaned up.

    >>> import skyward as sky
    >>> with sky.ComputePool(provider=sky.AWS(region="us-east-1"), accelerator="A100",
    ...                      nodes=4, plugins=[sky.plugins.torch()]) as pool:  # doctest: +SKIP
    ...     ...

    Args:
        region: the AWS region (default: the session's, e.g. ``AWS_DEFAULT_REGION``).
        instance_type: launch exactly this type (e.g. ``"g5.xlarge"``) instead of choosing.
        vcpus: minimum vCPUs per node (CPU pools choose by this and ``memory_gb``).
        memory_gb: minimum GiB of RAM per node.
        arch: ``"x86_64"`` (default), ``"arm64"``, or ``None`` for either.
        allocation: ``"spot-if-available"`` (spot, falling back to on-demand when spot is
            refused for capacity or quota), ``"spot"`` or ``"on-demand"`` (strict).
        ami: an AMI id, or ``"resolve:ssm:<parameter>"``; default: the Deep Learning base AMI
            (NVIDIA drivers) for CUDA types, Ubuntu 24.04 LTS otherwise (:data:`DLAMI_PARAMETER`,
            :data:`UBUNTU_PARAMETER`).
        subnet_id: launch into this subnet (its AZ and VPC); default: the default VPC's subnets.
        public_ip: give instances a public address (``None``: the subnet's setting).
        disk_gb: root volume size (at least the AMI's own size); always encrypted (EBS).
        disk_tier: the root volume's speed: ``"low"`` (gp3), ``"medium"`` (gp3, raised IOPS),
            ``"high"``/``"ultra"``/``"best"`` (io2); ``None``: gp3.
        ports: TCP ports (``8080``, ``"9000-9010"``) opened to ``ssh_cidr``, as SSH is.
        zone: launch only in this availability zone (its default subnet).
        labels: extra tags on the instances (a task file's ``resources.labels``).
        idle_timeout: seconds without the client's SSH connection after which an instance
            powers itself off (and so is terminated; a named cluster's is stopped, and its
            workers keep it up until their autostop).
        max_lifetime: seconds after boot at which an instance powers off regardless
            (``None``: no limit — only if you watch your bill). Named clusters have no limit
            unless this is given.
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
        root: as for :class:`~skyward.SSH`: where environments live on each host.
        find_links: as for :class:`~skyward.SSH`: a local wheelhouse on the hosts.
        no_index: as for :class:`~skyward.SSH`: install from ``find_links`` only.
        bootstrap_timeout: as for :class:`~skyward.SSH`: seconds an environment build may take.
        boot_timeout: seconds for instances to run and answer on SSH.
        session: a ``boto3.Session`` to use (profiles, SSO, hooks).
        profile: the name of a profile in ``~/.aws/config`` (instead of ``session``).

    Raises :class:`~skyward.ConfigError` naming the parameter for invalid input — when made,
    and (with the region's offer) when the pool is made, before anything is launched.
    """

    name = "aws"
    #: The file a named cluster's resident workers touch to keep their machine up (the watchdog
    #: powers it off once the file is ``idle_timeout`` seconds old).
    heartbeat_file = watchdog.HEARTBEAT_FILE

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
        disk_tier: str | None = None,
        ports: Sequence[int | str | tuple[int, int]] = (),
        zone: str | None = None,
        labels: Mapping[str, str] | None = None,
        idle_timeout: float = 600.0,
        max_lifetime: float | None = DEFAULT_MAX_LIFETIME,
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
        from skyward.providers.aws._options import aws_options, login_files

        o = aws_options(region=region, instance_type=instance_type, vcpus=vcpus, memory_gb=memory_gb, arch=arch,
                        allocation=allocation, ami=ami, subnet_id=subnet_id, public_ip=public_ip, disk_gb=disk_gb,
                        disk_tier=disk_tier, ports=ports, zone=zone, labels=labels or {},
                        idle_timeout=idle_timeout, max_lifetime=max_lifetime, user=user, known_hosts=known_hosts,
                        ssh_cidr=ssh_cidr, allow_ssh_from_anywhere=allow_ssh_from_anywhere,
                        ip_lookup_url=ip_lookup_url, ssh_via=ssh_via, root=root,
                        find_links=find_links, no_index=no_index, boot_timeout=boot_timeout,
                        bootstrap_timeout=bootstrap_timeout, connect_timeout=connect_timeout, session=session,
                        profile=profile)
        self.ssh_key, self._public_key, self.known_hosts = login_files(ssh_key, o.known_hosts)

        if o.region is not None:  # a typo fails here, not as whatever an unknown endpoint answers
            session = require("botocore.session", "sky.AWS")
            api.check_region(session.get_session(), o.region)
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
        self.disk_tier, self.ports, self.zone, self.labels = o.disk_tier, o.ports, o.zone, dict(o.labels)
        self.idle_timeout = o.idle_timeout
        self.max_lifetime = o.max_lifetime
        self._max_lifetime_given = max_lifetime is not DEFAULT_MAX_LIFETIME
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

        self._start_afresh()

    def _start_afresh(self) -> None:
        """This process's own state: a lock, the EC2 client, the validated plans, the launched pools."""
        self._lock = threading.Lock()
        self._client: api.EC2 | None = None
        self._plans: dict[str, LaunchPlan] = {}
        self._pools: dict[str, PoolState] = {}
        self._owner: dict[str, str] = {}  # instance id -> pool id

    def __getstate__(self) -> dict[str, Any]:
        """What a named cluster's record keeps (pickled): the settings, without the lock, the
        client, the cached plans and this process's pools (a later process works from the
        instances' ids and tags), nor a ``session`` (it may hold credentials; the unpickled
        provider uses ``profile`` or the default credential chain)."""
        state = dict(self.__dict__)
        for transient in ("_lock", "_client", "_plans", "_pools", "_owner"):
            state.pop(transient, None)
        state["session"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._start_afresh()

    def _ec2(self) -> api.EC2:
        with self._lock:
            if self._client is None:
                self._client = api.EC2.connect(self.region, session=self.session, profile=self.profile)
            return self._client

    # -- 1. plan ----------------------------------------------------------------------------------
    def plan(self, spec: PoolSpec) -> LaunchPlan:
        """What a launch for ``spec`` would do, resolved with read-only calls; nothing is created.

        Raises ConfigError (naming the parameter) when the request cannot be met here.
        """
        if not isinstance(spec.nodes, int) or spec.nodes < 1:
            raise ConfigError("nodes", "an integer >= 1", spec.nodes)
        return plan_launch(self._ec2(), spec, instance_type=self.instance_type, vcpus=self.vcpus,
                           memory_gb=self.memory_gb, arch=self.arch, allocation=self.allocation, ami=self.ami,
                           subnet_id=self.subnet_id, zone=self.zone)

    def validate(self, spec: PoolSpec) -> None:
        """Resolve the launch plan now, so a request AWS cannot serve fails before any launch."""
        try:
            plan = self.plan(spec)
        except ConfigError:
            raise
        except ProvisionError:
            # AWS unreachable right now: check what can be checked offline; provision will
            # try again (and say what is wrong).
            choose(catalog.load_catalog(), spec, instance_type=self.instance_type, vcpus=self.vcpus,
                   memory_gb=self.memory_gb, arch=self.arch)
            return
        with self._lock:
            self._plans[spec.pool_id] = plan

    # -- 2, 3. launch -----------------------------------------------------------------------------
    def provision(self, spec: PoolSpec) -> list[Instance]:
        """Launch ``spec.nodes`` instances and return them, or clean up everything and raise."""
        with self._lock:
            plan = self._plans.pop(spec.pool_id, None)
        if plan is None or plan.nodes != spec.nodes:
            plan = self.plan(spec)
        pool = PoolState(spec.pool_id, plan)
        if spec.cluster is not None:  # its key must outlive this process (and a reboot)
            pool.directory = str(machines.cluster_directory(spec.pool_id, create=True))
        with self._lock:
            self._pools[spec.pool_id] = pool
        try:
            return self._provision(pool, spec)
        except BaseException as exc:
            self._clean_up_failed(pool, exc)
            raise

    def _provision(self, pool: PoolState, spec: PoolSpec) -> list[Instance]:
        ec2 = self._ec2()
        ssh_cidr = resolve_ssh_cidr(self.ssh_cidr, self.ip_lookup_url)
        group_id, host_key = create_access(ec2, pool, ssh_cidr=ssh_cidr, ssh_key=self.ssh_key,
                                           public_key=self._public_key, make_host_key=self.known_hosts is None,
                                           ports=self.ports)
        shutdown, lifetime = watchdog.power_off_policy(
            cluster=spec.cluster is not None, down=spec.cluster_down,
            max_lifetime=self.max_lifetime, max_lifetime_given=self._max_lifetime_given)
        user_data = watchdog.user_data(idle_timeout=self.idle_timeout, max_lifetime=lifetime, host_key=host_key)
        described = launch(ec2, pool, group_id=group_id, user_data=user_data, shutdown_behavior=shutdown,
                           **self._launch_settings())
        pool.group_id, pool.user_data, pool.host_key = group_id, user_data, host_key
        return self._adopt(pool, describe(self, pool, described, host_key))

    def _launch_settings(self) -> dict[str, Any]:
        """The settings every launch of this provider's pools runs with (see :func:`launch`)."""
        return {"disk_gb": self.disk_gb, "public_ip": self.public_ip, "allocation": self.allocation,
                "boot_timeout": self.boot_timeout, "teardown_timeout": self.teardown_timeout,
                "disk_tier": self.disk_tier, "labels": self.labels}

    def _adopt(self, pool: PoolState, instances: list[Instance]) -> list[Instance]:
        """Tag each new instance with its node and count it as the pool's."""
        ec2 = self._ec2()
        for inst in instances:
            ec2.call("create_tags", {"Resources": [inst.id], "Tags": [{"Key": api.TAG_NODE, "Value": str(inst.node)}]})
        pool.instances = pool.instances + instances
        with self._lock:
            for inst in instances:
                self._owner[inst.id] = pool.pool_id
        return instances

    can_acquire = True

    def acquire(self, spec: PoolSpec, nodes: list[int], exclude: frozenset[str]) -> list[Instance]:
        """One RunInstances for ``len(nodes)`` more instances of the running pool (its plan's
        types, zones and markets: the same spot fallback as :meth:`provision`; its key, security
        group and user data), tagged with the pool and each its node number. An attempt that
        fails terminates only its own instances. (New instances never have an id in
        ``exclude``.)"""
        with self._lock:
            pool = self._pools.get(spec.pool_id)
        if pool is None:
            raise ProvisionError(f"pool {spec.pool_id} was not provisioned by this provider", provider="aws")
        more = PoolState(pool.pool_id, replace(pool.plan, nodes=len(nodes)), directory=pool.directory,
                         key_path=pool.key_path, instances=list(pool.instances), known_addrs=pool.known_addrs)
        described = launch(self._ec2(), more, group_id=pool.group_id, user_data=pool.user_data,
                           **self._launch_settings())
        try:
            instances = describe(self, more, described, pool.host_key, nodes)
        except BaseException:
            inventory.terminate(self._ec2(), [i["InstanceId"] for i in described], timeout=self.teardown_timeout)
            raise
        pool.known_addrs = more.known_addrs
        return self._adopt(pool, instances)

    # -- 5. release (skyward.providers.aws.release) -----------------------------------------------
    def terminate(self, instances: list[Instance]) -> None:
        """Release every pool these instances belong to, by tag, and confirm it. Works in any
        process: a pool this one did not launch is found by its instances' tags."""
        self._release_pools(self._pools_of(instances))

    def release(self, instances: list[Instance]) -> None:
        """Terminate just ``instances`` (an elastic pool's node, released or lost) and confirm
        it; the pool's key pair, security group and other instances stay."""
        self._release_instances(instances)

    def release_pool(self, pool_id: str) -> None:
        """Destroy everything tagged with ``pool_id`` (instances, key pair, security group),
        whether this process knows the pool or not (a named cluster's client killed while
        launching), confirm it, and drop the pool's private files."""
        self._release_pools([pool_id])

    def end_pool(self, pool_id: str, instances: list[Instance]) -> None:
        """:meth:`release_pool`: by the pool's tag, its key pair and security group with it."""
        self._release_pools([pool_id])

    # -- named clusters: stop, start, states (skyward.providers.aws.machines) ------------------------
    def machine_states(self, instances: list[Instance]) -> list[str]:
        """Each instance's EC2 state (``"running"``, ``"stopped"``...), ``"missing"`` if unknown."""
        return machines.states_of(self._ec2(), instances)

    def stop(self, instances: list[Instance]) -> None:
        """Stop the instances (disks kept) and confirm it; see :func:`machines.stop`."""
        machines.stop(self._ec2(), instances, self.teardown_timeout)

    def stop_refusal(self, instances: list[Instance]) -> str | None:
        """Why :meth:`stop` would refuse these instances (spot ones), or None."""
        return machines.stop_refusal(self._ec2(), instances)

    def start(self, instances: list[Instance]) -> list[Instance]:
        """Start them again and return them described anew; see :func:`machines.start`."""
        states = machines.start(self._ec2(), instances, self.boot_timeout)
        return machines.described_again(instances, states, functools.partial(connect_address, self.ssh_via),
                                        rewrite_known_hosts=self.known_hosts is None)

    def __repr__(self) -> str:
        shown = [repr(self.region)] if self.region else []
        if self.instance_type:
            shown.append(f"instance_type={self.instance_type!r}")
        if self.allocation != "spot-if-available":
            shown.append(f"allocation={self.allocation!r}")
        return f"AWS({', '.join(shown)})"

