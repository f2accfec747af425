"""The skyward-tagged resources of a region: listing them, and removing them with confirmation.

Every resource a pool creates carries ``skyward:pool=<pool id>`` (see :mod:`.ec2`);
:func:`list_resources` finds them by that tag, :func:`terminate` ends instances and waits until
EC2 says they are going, and :func:`destroy` removes a pool's instances, key pair and security
group and confirms each is gone — what pool teardown, the cleanup of a failed launch, and
``skyward ls`` / ``skyward down`` use.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from skyward._retry import Backoff
from skyward.errors import ProvisionError
from skyward.providers.aws.ec2 import (
    _NOT_FOUND_SUFFIX,
    EC2,
    GONE_STATES,
    TAG_CREATED,
    TAG_NODE,
    TAG_POOL,
    aws_code,
    pool_filter,
)

__all__ = ["PoolResources", "TaggedInstance", "TaggedKeyPair", "TaggedSecurityGroup", "destroy", "instance_states",
           "list_resources", "terminate"]


def _tag(tags: Sequence[Mapping[str, str]] | None, key: str) -> str:
    for t in tags or ():
        if t.get("Key") == key:
            return str(t.get("Value", ""))
    return ""


def _created(tags: Any, fallback: datetime | None = None) -> datetime | None:
    text = _tag(tags, TAG_CREATED)
    if text:
        with contextlib.suppress(ValueError):
            return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    return fallback


@dataclass(frozen=True, slots=True)
class TaggedInstance:
    id: str
    pool: str
    instance_type: str
    state: str
    market: str  # "spot" or "on-demand"
    zone: str
    private_ip: str
    public_ip: str
    node: int | None
    launched: datetime | None


@dataclass(frozen=True, slots=True)
class TaggedKeyPair:
    name: str
    id: str
    pool: str
    created: datetime | None


@dataclass(frozen=True, slots=True)
class TaggedSecurityGroup:
    id: str
    name: str
    pool: str
    vpc_id: str
    created: datetime | None


@dataclass(frozen=True, slots=True)
class PoolResources:
    """Skyward-tagged resources in one region (instances include terminated ones)."""

    instances: tuple[TaggedInstance, ...] = ()
    key_pairs: tuple[TaggedKeyPair, ...] = ()
    security_groups: tuple[TaggedSecurityGroup, ...] = ()

    @property
    def live_instances(self) -> tuple[TaggedInstance, ...]:
        """Instances not yet shutting down or terminated (those still bill)."""
        return tuple(i for i in self.instances if i.state not in GONE_STATES)

    @property
    def empty(self) -> bool:
        """True when nothing is left: no live instance, key pair or security group."""
        return not (self.live_instances or self.key_pairs or self.security_groups)

    @property
    def pools(self) -> list[str]:
        found = {i.pool for i in self.live_instances} | {k.pool for k in self.key_pairs}
        found |= {g.pool for g in self.security_groups}
        return sorted(found)

    def describe(self) -> str:
        parts = []
        if self.live_instances:
            parts.append("instances " + ", ".join(f"{i.id} ({i.state})" for i in self.live_instances))
        if self.key_pairs:
            parts.append("key pairs " + ", ".join(k.name for k in self.key_pairs))
        if self.security_groups:
            parts.append("security groups " + ", ".join(f"{g.id} ({g.name})" for g in self.security_groups))
        return "; ".join(parts) or "nothing"


def _instance(item: Mapping[str, Any]) -> TaggedInstance:
    tags = item.get("Tags")
    node = _tag(tags, TAG_NODE)
    return TaggedInstance(
        id=item["InstanceId"],
        pool=_tag(tags, TAG_POOL),
        instance_type=item.get("InstanceType", ""),
        state=item.get("State", {}).get("Name", ""),
        market="spot" if item.get("InstanceLifecycle") == "spot" else "on-demand",
        zone=item.get("Placement", {}).get("AvailabilityZone", ""),
        private_ip=item.get("PrivateIpAddress", "") or "",
        public_ip=item.get("PublicIpAddress", "") or "",
        node=int(node) if node.isdigit() else None,
        launched=item.get("LaunchTime"),
    )


def list_resources(ec2: EC2, pool_id: str | None = None) -> PoolResources:
    """Every resource tagged ``skyward:pool`` (``=pool_id`` when given) in the client's region."""
    filters = pool_filter(pool_id)
    instances = [_instance(item)
                 for page in ec2.pages("describe_instances", {"Filters": filters})
                 for reservation in page.get("Reservations", [])
                 for item in reservation.get("Instances", [])]
    keys = [TaggedKeyPair(k["KeyName"], k.get("KeyPairId", ""), _tag(k.get("Tags"), TAG_POOL),
                          _created(k.get("Tags"), k.get("CreateTime")))
            for k in ec2.call("describe_key_pairs", {"Filters": filters}).get("KeyPairs", [])]
    groups = [TaggedSecurityGroup(g["GroupId"], g.get("GroupName", ""), _tag(g.get("Tags"), TAG_POOL),
                                  g.get("VpcId", ""), _created(g.get("Tags")))
              for page in ec2.pages("describe_security_groups", {"Filters": filters})
              for g in page.get("SecurityGroups", [])]
    return PoolResources(tuple(sorted(instances, key=lambda i: (i.pool, i.node if i.node is not None else -1, i.id))),
                         tuple(keys), tuple(groups))


def instance_states(ec2: EC2, ids: Sequence[str]) -> dict[str, Mapping[str, Any]]:
    """The current description of each of ``ids`` (missing ones are left out: not visible yet)."""
    found: dict[str, Mapping[str, Any]] = {}
    if not ids:
        return found
    try:
        pages = list(ec2.pages("describe_instances", {"InstanceIds": list(ids)}))
    except ProvisionError as exc:
        if not aws_code(exc).endswith(_NOT_FOUND_SUFFIX):
            raise
        # EC2 is eventually consistent: a just-launched id may not be describable yet.
        pages = list(ec2.pages("describe_instances", {"Filters": [{"Name": "instance-id", "Values": list(ids)}]}))
    for page in pages:
        for reservation in page.get("Reservations", []):
            for item in reservation.get("Instances", []):
                found[item["InstanceId"]] = item
    return found


def terminate(ec2: EC2, ids: Sequence[str], *, timeout: float) -> list[str]:
    """Terminate ``ids`` and wait until each is shutting down or terminated; return the unconfirmed."""
    if not ids:
        return []
    try:
        ec2.call("terminate_instances", {"InstanceIds": list(ids)})
    except ProvisionError as exc:
        if not aws_code(exc).endswith(_NOT_FOUND_SUFFIX):
            raise
        for one in ids:  # one unknown id fails the whole call: go one by one
            with contextlib.suppress(ProvisionError):
                ec2.call("terminate_instances", {"InstanceIds": [one]})
    pending = list(ids)
    for _ in Backoff(timeout=timeout, delay=0.1, max_delay=2.0):
        states = instance_states(ec2, ids)
        pending = [i for i in ids if states.get(i, {}).get("State", {}).get("Name") not in GONE_STATES]
        if not pending:
            break
    return pending


def destroy(ec2: EC2, pool_id: str | None, *, timeout: float = 300.0, settle: float = 0.0) -> PoolResources:
    """Remove every resource of ``pool_id`` (of every pool with ``None``) and confirm it.

    Order: terminate live instances and wait until each is shutting down or terminated; sweep
    again after ``settle`` seconds when a launch may still be surfacing (EC2's eventual
    consistency); delete the key pairs; delete the security groups, retrying while EC2 says
    they are still in use (until the instances are fully terminated). Returns what is left —
    empty on success; the caller decides whether leftovers are an error.
    """
    deadline = time.monotonic() + timeout
    sweeps = 0
    while True:
        found = list_resources(ec2, pool_id)
        live = [i.id for i in found.live_instances]
        sweeps += 1
        if live:
            terminate(ec2, live, timeout=max(1.0, deadline - time.monotonic()))
        if sweeps > 1 or settle <= 0:
            if not live or time.monotonic() >= deadline:
                break
            continue
        time.sleep(settle)
    found = list_resources(ec2, pool_id)
    for key in found.key_pairs:
        with contextlib.suppress(ProvisionError):
            ec2.call("delete_key_pair", {"KeyName": key.name})
    groups = list(found.security_groups)
    for _ in Backoff(timeout=deadline - time.monotonic(), delay=0.2, max_delay=5.0):
        if not groups:
            break
        waiting = []
        for group in groups:
            try:
                ec2.call("delete_security_group", {"GroupId": group.id})
            except ProvisionError as exc:
                code = aws_code(exc)
                if code == "DependencyViolation":
                    waiting.append(group)  # instances still shutting down use it
                elif not code.endswith(_NOT_FOUND_SUFFIX):
                    raise
        groups = waiting
    return list_resources(ec2, pool_id)
