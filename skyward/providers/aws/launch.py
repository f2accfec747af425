"""Launching a pool on AWS: the pool's own way in, then the plan's attempts in order.

Steps 2 and 3 of :mod:`skyward.providers.aws.provider`:

* :func:`create_access` makes the pool's login key (or takes the user's), a host key for the
  pool when no known_hosts file is given, and, on AWS, the key pair and a security group
  allowing SSH from the client's address range (:func:`resolve_ssh_cidr`).
* :func:`launch` runs the plan's attempts (type, AZ, market) in order until one gives every
  node running; a refusal for capacity or quota moves on to the next attempt, and whatever a
  failed attempt started is terminated before the next one.

:class:`PoolState` is what the provider keeps for one pool; a launch fills it in, the
release reads it — ``launch_in_flight`` says that AWS may hold instances no answer named.
"""

from __future__ import annotations

import ipaddress
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from skyward._retry import Backoff
from skyward.errors import CapacityError, ConfigError, ProvisionError
from skyward.providers.aws import ec2 as api
from skyward.providers.aws import inventory
from skyward.providers.aws import watchdog
from skyward.providers.aws.keys import new_key_pair, write_private
from skyward.providers.aws.plan import LaunchPlan
from skyward.providers.base import Instance

__all__ = ["PoolState", "create_access", "launch", "lookup_public_ip", "resolve_ssh_cidr", "scratch_prefix"]


@dataclass
class PoolState:
    """What the provider holds for one pool: its plan, its private files, its instances."""

    pool_id: str
    plan: LaunchPlan
    directory: str = ""  # private temp dir: the pool's private key and known_hosts
    key_path: str = ""
    instances: list[Instance] = field(default_factory=list)
    summary: str = ""  # "spot g5.xlarge in us-east-1a"
    launch_in_flight: bool = False  # a RunInstances whose outcome is unknown
    #: What a later launch for the same pool (an elastic pool's scale-up) reuses.
    group_id: str = ""
    user_data: str = ""
    host_key: Any = None
    known_addrs: list[str] = field(default_factory=list)  # in the pool's known_hosts file


# -- the pool's way in ------------------------------------------------------------------------------


def lookup_public_ip(url: str, timeout: float = 5.0) -> str:
    """This client's public address, as the service at ``url`` sees it."""
    import urllib.request

    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - a fixed https URL
        return str(ipaddress.ip_address(response.read(64).decode().strip()))


def resolve_ssh_cidr(ssh_cidr: str | None, ip_lookup_url: str) -> str:
    """``ssh_cidr``, or this client's public address (looked up at ``ip_lookup_url``) as a range.

    Raises ConfigError naming ``ssh_cidr`` when the lookup fails.
    """
    if ssh_cidr is not None:
        return ssh_cidr
    try:
        address = lookup_public_ip(ip_lookup_url)
    except (OSError, ValueError) as exc:
        raise ConfigError("ssh_cidr", "this client's public address as a range, e.g. '203.0.113.7/32'", None,
                          detail=f"could not look it up at {ip_lookup_url}: {exc}") from None
    return f"{address}/{32 if ':' not in address else 128}"


def scratch_prefix(pool_id: str) -> str:
    """The name an unnamed pool's private directory starts with (made by ``tempfile`` in the
    launching machine's temporary directory; a named cluster's is :func:`machines.cluster_directory`)."""
    return f"skyward-aws-{pool_id}-"


def create_access(ec2: api.EC2, pool: PoolState, *, ssh_cidr: str, ssh_key: str | None, public_key: str | None,
                  make_host_key: bool, ports: Sequence[tuple[int, int]] = ()) -> tuple[str, watchdog.HostKey | None]:
    """Make the pool's private directory and keys, then its key pair and security group on AWS.

    The login key is ``ssh_key`` (whose public half is ``public_key``) or a new ed25519 key,
    written 0600 in the pool's 0700 directory (``pool.directory``, ``pool.key_path``); only
    public halves are sent to AWS. Returns the security group's id and, with
    ``make_host_key``, the host key the pool's machines install at boot (else None).
    """
    pool.directory = pool.directory or tempfile.mkdtemp(prefix=scratch_prefix(pool.pool_id))  # mode 0700
    if ssh_key is not None:
        pool.key_path, public = ssh_key, public_key or ""
    else:
        private, public = new_key_pair()
        pool.key_path = write_private(pool.directory, "id_ed25519", private)
    host_key = None
    if make_host_key:
        host_private, host_public = new_key_pair()
        host_key = watchdog.HostKey("ed25519", host_public, host_private)

    ec2.call("import_key_pair", api.key_pair_request(pool.pool_id, public))
    group_id = ec2.call("create_security_group", api.security_group_request(pool.pool_id, pool.plan.vpc_id))["GroupId"]
    ec2.call("authorize_security_group_ingress", api.ingress_request(group_id, ssh_cidr, ports=ports))
    return group_id, host_key


# -- the attempts -----------------------------------------------------------------------------------


def launch(ec2: api.EC2, pool: PoolState, *, group_id: str, user_data: str, disk_gb: int, public_ip: bool | None,
           allocation: str, boot_timeout: float, teardown_timeout: float,
           shutdown_behavior: str = "terminate", disk_tier: str | None = None,
           labels: Mapping[str, str] | None = None) -> list[Mapping[str, Any]]:
    """Try the plan's attempts in order; return the running instances' descriptions by node.

    Sets ``pool.summary`` (what was launched where). Raises CapacityError naming the last type
    and AZ when every attempt was refused, ProvisionError for any other failure.
    """
    plan = pool.plan
    key_name = api.resource_name(pool.pool_id)  # the key pair create_access imported
    refusals: list[str] = []
    last: tuple[str, str] = ("", "")
    for n, (itype, place, market) in enumerate(plan.attempts()):
        image = plan.image_for(itype)
        disk = max(disk_gb, image.min_disk_gb)
        request = api.run_instances_request(
            pool_id=pool.pool_id, count=plan.nodes, instance_type=itype.name, image_id=image.image_id,
            subnet_id=place.subnet_id, group_id=group_id, key_name=key_name, market=market,
            user_data=user_data, client_token=f"skyward-{pool.pool_id}-{n}-{uuid.uuid4().hex[:8]}",
            root_device=image.root_device, disk_gb=disk, public_ip=public_ip, shutdown_behavior=shutdown_behavior,
            disk_tier=disk_tier, labels=labels)
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
            _give_up_attempt(ec2, pool, ids, teardown_timeout)
            continue
        running, problem = _wait_running(ec2, ids, boot_timeout)
        if problem:
            refusals.append(f"{market} {itype.name} in {place.zone}: {problem}")
            _give_up_attempt(ec2, pool, ids, teardown_timeout)
            continue
        pool.summary = f"{market} {itype.name} in {place.zone}"
        if refusals:
            pool.summary += f" (after: {refusals[-1]})"
        by_index = sorted(running, key=lambda item: (item.get("AmiLaunchIndex", 0), item["InstanceId"]))
        return by_index
    shown = refusals[-8:]
    more = f"\n  ... and {len(refusals) - len(shown)} earlier" if len(refusals) > len(shown) else ""
    raise CapacityError(f"no {allocation} capacity for {plan.nodes} node(s); AWS answered:{more}\n  "
                        + "\n  ".join(shown), provider="aws", instance_type=last[0], zone=last[1])


def _give_up_attempt(ec2: api.EC2, pool: PoolState, ids: Sequence[str], timeout: float) -> None:
    """Terminate a failed attempt's instances: those EC2 named, and any other of the pool's
    (an answer may have been incomplete) but those the pool already runs (``pool.instances``:
    a scale-up's launch); nothing of the attempt runs before the next one."""
    running = {i.id for i in pool.instances}
    tagged = [i.id for i in inventory.list_resources(ec2, pool.pool_id).live_instances if i.id not in running]
    left = inventory.terminate(ec2, list(dict.fromkeys([*ids, *tagged])), timeout=timeout)
    if left:
        raise ProvisionError(f"could not confirm the termination of {', '.join(left)}", provider="aws")


def _wait_running(ec2: api.EC2, ids: Sequence[str], timeout: float) -> tuple[list[Mapping[str, Any]], str]:
    """Wait until every instance runs with a private address: (descriptions, "") or ([], why not)."""
    ready: list[Mapping[str, Any]] = []
    for _ in Backoff(timeout=timeout, delay=0.2, max_delay=3.0):
        states = inventory.instance_states(ec2, ids)
        for item in states.values():
            state = item.get("State", {}).get("Name")
            if state in api.GONE_STATES or state == "stopped":
                reason = item.get("StateReason", {}).get("Message") or state
                return [], f"{item['InstanceId']} went {state} while starting ({reason})"
        ready = [states[i] for i in ids if i in states and states[i].get("State", {}).get("Name") == "running"
                 and states[i].get("PrivateIpAddress")]
        if len(ready) == len(ids):
            return ready, ""
    raise ProvisionError(f"instances not running after {timeout:g}s: "
                         + ", ".join(i for i in ids if i not in {r['InstanceId'] for r in ready}),
                         provider="aws")
