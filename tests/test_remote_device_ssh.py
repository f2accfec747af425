"""The remote ``sky`` torch device on SSH test hosts (network namespaces, real sshd): the same
MNIST steps as on the client's CPU, bit-exact, and nothing left on the host afterwards."""

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
