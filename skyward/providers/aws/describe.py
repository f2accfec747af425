"""Describing a pool's running EC2 instances as the pool reaches them (step 4 of
:mod:`skyward.providers.aws.provider`).

Each instance becomes an :class:`~skyward.providers.base.Instance` carrying

* its SSH address: the address the client connects to (:func:`connect_address`: public or
  private, after ``ssh_via``), the pool's login key, and a known_hosts file naming every address
  the pool has had with the pool's host key (or the user's own known_hosts files);
* its environment settings (where environments live, package sources, time limits, how long
  to retry the first connection while the machine boots);
* its price per hour as launched (:func:`price_per_hour`): the catalog's on-demand price, or its
  cached spot price when EC2 says the instance is spot — so a spot request that fell back to
  on-demand is priced on-demand.

The pool then reaches and prepares it exactly as an SSH host.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal, Protocol

from skyward.errors import ProvisionError
from skyward.providers.aws import catalog, catalog_cache, watchdog
from skyward.providers.aws.keys import write_private
from skyward.providers.aws.launch import PoolState
from skyward.providers.base import HostEnvironment, Instance, SSHAddress



class HostSettings(Protocol):
    """What describing an instance reads of the provider (:class:`~skyward.providers.aws.AWS`)."""

    known_hosts: tuple[str, ...] | None
    ssh_via: Literal["auto", "public", "private"]
    root: str
    find_links: Any
    no_index: bool
    boot_timeout: float
    bootstrap_timeout: float
    user: str
    connect_timeout: float

__all__ = ["connect_address", "describe", "price_per_hour"]


def describe(provider: HostSettings, pool: PoolState, described: Sequence[Mapping[str, Any]],
             host_key: watchdog.HostKey | None, nodes: Sequence[int] | None = None) -> list[Instance]:
    """The running instances ``described`` (EC2's descriptions) as nodes ``nodes`` (default 0,
    1, ...) in that order, reached and prepared with ``provider``'s settings."""
    itype = next(t for t in pool.plan.candidates if t.name == described[0]["InstanceType"])
    known: tuple[str, ...] = provider.known_hosts or ()
    if host_key is not None:
        addrs = [connect_address(provider.ssh_via, i["InstanceId"], i.get("PrivateIpAddress") or "",
                                 i.get("PublicIpAddress") or None) for i in described]
        known = (_known_hosts_file(pool, addrs, host_key),)
    environment = HostEnvironment(
        root=provider.root, find_links=provider.find_links, no_index=provider.no_index,
        bootstrap_timeout=provider.bootstrap_timeout, reach_timeout=provider.boot_timeout,
        # Stock AMIs rarely ship the client's Python version: let uv download it (unless
        # the image says otherwise).
        env={"UV_PYTHON_DOWNLOADS": "automatic"})
    instances = []
    for node, item in zip(range(len(described)) if nodes is None else nodes, described, strict=True):
        private_ip = item.get("PrivateIpAddress") or ""
        public_ip = item.get("PublicIpAddress") or None
        address = connect_address(provider.ssh_via, item["InstanceId"], private_ip, public_ip)
        spot = item.get("InstanceLifecycle") == "spot"
        instances.append(Instance(
            id=item["InstanceId"], node=node, private_addr=private_ip, public_addr=public_ip,
            # As SkyPilot: the devices asked for, not all the type has (L4:2 on a 4-GPU type: 2).
            accelerators=min(itype.gpu_count, pool.plan.accelerators or itype.gpu_count),
            ssh=SSHAddress(address, provider.user, key=pool.key_path, known_hosts=known,
                           connect_timeout=provider.connect_timeout),
            environment=replace(environment, note=f"{pool.summary}: {item['InstanceId']} at {private_ip}"),
            spot=spot, price_per_hour=price_per_hour(pool.plan.region, itype, spot=spot)))
    return instances


def price_per_hour(region: str, itype: catalog.InstanceType, *, spot: bool) -> float | None:
    """What one instance of ``itype`` costs per hour in ``region`` (approximate USD): its spot
    price in the region's cached catalog when it runs as spot (None without one: the bundled
    snapshot has no spot prices), else the plan's on-demand price (cached or bundled)."""
    if spot:
        return catalog_cache.spot_price(region, itype.name)
    return itype.price_per_hour


def connect_address(ssh_via: str, instance_id: str, private_ip: str, public_ip: str | None) -> str:
    """The address the client connects to: the private one with ``ssh_via="private"`` (or
    ``"auto"`` without a public one), else the public one; ProvisionError when it has none."""
    if ssh_via == "private" or (ssh_via == "auto" and not public_ip):
        if not private_ip:
            raise ProvisionError(f"instance {instance_id} has no private address", provider="aws")
        return private_ip
    if not public_ip:
        raise ProvisionError(f"instance {instance_id} has no public address; pass public_ip=True, "
                             "or ssh_via='private' when this client is inside the VPC", provider="aws")
    return public_ip


def _known_hosts_file(pool: PoolState, addrs: Sequence[str], host_key: watchdog.HostKey) -> str:
    """The pool's known_hosts file, naming every address the pool has had (``addrs`` added)
    with its host key; a scale-up's file is replaced whole, never left half written."""
    first = not pool.known_addrs
    pool.known_addrs = list(dict.fromkeys(pool.known_addrs + list(addrs)))
    lines = "".join(f"{addr} {host_key.public}\n" for addr in pool.known_addrs)
    if first:
        return write_private(pool.directory, "known_hosts", lines)
    staged = write_private(pool.directory, f"known_hosts.{len(pool.known_addrs)}", lines)
    path = os.path.join(pool.directory, "known_hosts")
    os.replace(staged, path)
    return path
