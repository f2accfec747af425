"""No port is opened to the network: what a Local pool's workers listen on, read from /proc.

The torch plugin's rendezvous store (and gloo's own sockets) on the Local provider listen on
loopback only, so no other network namespace or machine can reach them.
"""

from __future__ import annotations

import ipaddress
import os
import socket

import skyward as sky
from tests.hosts.conftest_fixture import wheelhouse  # noqa: F401  (a fixture)

LISTEN = "0A"  # the TCP state "listen" in /proc/net/tcp


def _address(hex_addr: str) -> str:
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    # /proc/net/tcp6: four 32-bit words, each in host (little-endian) order
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words)


def listening(pids: list[int]) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state held open by one of ``pids``."""
    inodes = set()
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pids[0]}/net/{table}") as f:
            next(f)
            for line in f:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == LISTEN and inode in inodes:
                    addr, port = local.split(":")
                    found.append((_address(addr), int(port, 16)))
    return found


@sky.compute
def all_reduce_and_head_port() -> tuple[float, int]:
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    dist.all_reduce(t)
    return float(t.item()), sky.instance_info().head_port


def test_torch_rendezvous_and_collectives_listen_on_loopback_only() -> None:
    with sky.ComputePool(nodes=2, plugins=[sky.plugins.torch(backend="gloo")], console=False) as pool:
        results = all_reduce_and_head_port() @ pool
        assert [r[0] for r in results] == [2.0, 2.0]
        head_port = results[0][1]
        sockets = listening([pid for pid in pool.worker_pids() if pid is not None])
    assert any(port == head_port for _, port in sockets), sockets  # the store is among them
    exposed = [(a, p) for a, p in sockets if not ipaddress.ip_address(a).is_loopback]
    assert exposed == [], f"listening beyond loopback: {exposed}"


def test_on_ssh_hosts_the_rendezvous_store_listens_on_the_heads_address_only(test_hosts, wheelhouse) -> None:
    from tests.hosts.conftest_fixture import ssh_provider

    hosts = test_hosts[:2]
    # torch is preinstalled in the hosts' Python: take it from there instead of installing it.
    provider = ssh_provider(hosts, wheelhouse, system_site_packages=["torch", "numpy"])
    with sky.ComputePool(provider=provider, nodes=2, plugins=[sky.plugins.torch(backend="gloo")],
                         console=False) as pool:
        results = all_reduce_and_head_port() @ pool
        assert [r[0] for r in results] == [2.0, 2.0]
        head_port = results[0][1]
        sockets = listening(hosts[0].processes(r"skyward\.worker"))
    store = [a for a, p in sockets if p == head_port]
    assert store == [hosts[0].ip], sockets  # the address the peers use, nothing else
    wildcard = [(a, p) for a, p in sockets if ipaddress.ip_address(a).is_unspecified]
    assert wildcard == [], f"listening on every interface: {wildcard}"
