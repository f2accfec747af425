"""The torch plugin across SSH hosts set up like Debian, whose /etc/hosts maps the host's own
name to 127.0.1.1: the process group uses the interface that routes to the head (the address
the pool reached each node at), so the ranks meet whatever /etc/hosts says."""

from __future__ import annotations

from pathlib import Path

import pytest

import skyward as sky
from tests.test_ssh import leftovers, pool_on, ssh_provider

pytest.importorskip("torch")


@pytest.fixture
def debian_hosts(test_hosts):
    """Two test hosts whose own name resolves to 127.0.1.1 (Debian's default /etc/hosts)."""
    hosts = test_hosts[:2]
    files = {h.name: Path(h.dir, "hosts") for h in hosts}
    saved = {name: f.read_text() for name, f in files.items()}
    try:
        for h in hosts:  # written in place: the file is bind-mounted over the host's /etc/hosts
            files[h.name].write_text(f"127.0.0.1\tlocalhost\n127.0.1.1\t{h.name}\n")
        for h in hosts:
            rc, out, err = h.run("getent hosts $(hostname)")
            assert rc == 0 and out.split()[0] == "127.0.1.1", out + err
        yield hosts
    finally:
        for name, f in files.items():
            f.write_text(saved[name])


def test_ranks_meet_on_hosts_whose_name_resolves_to_loopback(debian_hosts, wheelhouse) -> None:
    @sky.compute
    def world() -> tuple[int, int, float, str | None]:
        import os

        import torch
        import torch.distributed as dist

        t = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(t)
        return dist.get_rank(), dist.get_world_size(), float(t.item()), os.environ.get("GLOO_SOCKET_IFNAME")

    # torch is preinstalled in the hosts' Python; the resolver has no route (see test_ssh.py).
    provider = ssh_provider(debian_hosts, wheelhouse, system_site_packages=["torch", "numpy"])
    image = sky.Image(env={"RES_OPTIONS": "timeout:1 attempts:1"})
    plugins = [sky.plugins.torch(backend="gloo", timeout=20)]
    with pool_on(debian_hosts, wheelhouse, image, provider=provider, plugins=plugins, start_timeout=60) as pool:
        assert world() @ pool == [(0, 2, 3.0, "eth0"), (1, 2, 3.0, "eth0")]
    assert not leftovers(debian_hosts)
