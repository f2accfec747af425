"""The remote ``sky`` torch device on SSH test hosts (network namespaces, real sshd): the same
MNIST steps as on the client's CPU, bit-exact, and nothing left on the host afterwards.

Internals on purpose, through ``skyward.testing``: the client's device records and the node's
sessions are read to check what no public call shows: that nothing accumulates, and which
peer a copy goes to."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

import skyward as sky  # noqa: E402
from skyward.torch import Compute  # noqa: E402
from tests.test_remote_device import MNISTNet, mnist_batches, same_parameters, train  # noqa: E402
from tests.test_ssh import leftovers, ssh_provider  # noqa: E402


def test_mnist_steps_on_an_ssh_hosts_device_equal_the_cpu(test_hosts, wheelhouse) -> None:
    host = test_hosts[:1]
    # torch is preinstalled in the hosts' Python (they have no route to an index).
    provider = ssh_provider(host, wheelhouse, system_site_packages=["torch", "numpy"])
    torch.manual_seed(0)
    local = MNISTNet()
    remote = copy.deepcopy(local)
    batches = mnist_batches(3)
    with Compute(provider=provider, start_timeout=90) as node:
        device = node.device("cpu")
        assert node.pool.instances[0].ssh.host == host[0].ip
        remote_losses = train(remote, device, batches)
        assert remote_losses == train(local, "cpu", batches)
        assert same_parameters(remote, local)
        with pytest.raises(sky.DeviceError, match="has no 'cuda' device; it has: cpu"):
            node.device("cuda")
    assert not leftovers(host)


def test_copies_between_two_hosts_go_host_to_host(test_hosts, wheelhouse) -> None:
    from skyward.torch import Cluster
    from skyward.testing import connection, device_record

    hosts = test_hosts[:2]
    computes = [Compute(provider=ssh_provider([h], wheelhouse, system_site_packages=["torch", "numpy"]),
                        start_timeout=90) for h in hosts]
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (a copy through the client would warn)
        with Cluster(*computes) as (a, b):
            da, db = a.device(), b.device()
            peer_b = device_record(db).peer
            assert peer_b["address"] == hosts[1].ip  # b takes copies on the address a reaches it at
            x = torch.randn(1 << 20)  # 4 MiB
            sa = x.to(da)
            torch.sky.synchronize()
            before = sum(connection(c.pool, 0).received_bytes for c in (a, b))
            sb = sa.to(db)
            sb.mul_(2)
            sa.copy_(sb)
            total = sa.sum().item()
            moved = sum(connection(c.pool, 0).received_bytes for c in (a, b)) - before
            assert moved < 64 << 10, moved  # the 8 MiB copied went host to host
            assert total == pytest.approx(float(x.sum() * 2), rel=1e-4)
    assert not leftovers(hosts)


def test_a_host_that_cannot_reach_the_local_node_copies_through_the_client(test_hosts, wheelhouse) -> None:
    from skyward.torch import Cluster

    host = test_hosts[:1]
    remote = Compute(provider=ssh_provider(host, wheelhouse, system_site_packages=["torch", "numpy"]),
                     start_timeout=90)
    with Cluster(Compute(provider=sky.Local()), remote) as (local, ssh):
        dl, ds = local.device(), ssh.device()
        x = torch.arange(10.0)
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("error")
            on_host = x.to(dl).to(ds)  # local -> host: direct (the Local worker reaches the host)
        with pytest.warns(UserWarning, match="through the client: the nodes cannot reach each other"):
            back = on_host.to(dl)  # host -> local: 127.0.0.1 is the host's own loopback
        assert back.tolist() == x.tolist() and back.device == dl
    assert not leftovers(host)
