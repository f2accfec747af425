"""``torch.sky``, the device module torch consults once a ``sky`` device is open: CPU code runs as
before (generator helpers, activation checkpointing), and the same helpers work on ``sky``
tensors (checkpointing in both modes, autocast), against the same code on the CPU; on the Local
provider, real worker processes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
checkpoint = torch.utils.checkpoint.checkpoint

import skyward as sky  # noqa: E402
from skyward.torch import Compute  # noqa: E402


@pytest.fixture(scope="module")
def device() -> Iterator[torch.device]:
    with Compute(provider=sky.Local()) as node:
        yield node.device("cpu")


def test_cpu_generator_helpers_work_once_a_device_is_open(device: torch.device) -> None:
    from torch.testing._internal.common_utils import freeze_rng_state

    torch.manual_seed(0)
    with torch.random.fork_rng():
        first = torch.randn(4)
    with freeze_rng_state():
        again = torch.randn(4)
    assert torch.equal(first, again) and torch.equal(torch.randn(4), first)


def test_cpu_checkpoint_works_once_a_device_is_open(device: torch.device) -> None:
    x = torch.randn(5, requires_grad=True)
    for reentrant in (True, False):
        x.grad = None
        checkpoint(torch.sin, x, use_reentrant=reentrant).sum().backward()
        assert torch.equal(x.grad, torch.cos(x.detach()))


def test_fork_rng_forks_the_nodes_generator(device: torch.device) -> None:
    torch.manual_seed(1)
    with torch.random.fork_rng(device_type="sky"):
        inside = torch.rand(6, device=device).cpu()
    after = torch.rand(6, device=device).cpu()
    assert torch.equal(inside, after)  # the draw inside was undone, on the node
    state = torch.sky.get_rng_state(device)
    drawn = torch.rand(3, device=device).cpu()
    torch.sky.set_rng_state(state, device)
    assert torch.equal(torch.rand(3, device=device).cpu(), drawn)
    assert torch.sky.get_rng_state_all()[device.index].dtype == torch.uint8


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(nn.functional.dropout(torch.tanh(self.a(x)), 0.3, training=True))


def checkpointed_grads(where: torch.device | str, reentrant: bool, preserve: bool) -> list[torch.Tensor]:
    torch.manual_seed(0)
    block = Block().to(where)
    x = torch.randn(4, 8).to(where).requires_grad_()
    torch.manual_seed(5)  # (the node's generator too: both draw the same dropout mask)
    y = checkpoint(block, x, use_reentrant=reentrant, preserve_rng_state=preserve)
    y.pow(2).sum().backward()
    return [t.grad.cpu() for t in (x, *block.parameters())]


@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpoint_on_sky_gives_the_cpus_gradients(device: torch.device, reentrant: bool) -> None:
    # (dropout in the block: the recomputation sees the same mask only if the node's generator
    # state was saved and restored)
    assert all(torch.equal(a, b) for a, b in zip(checkpointed_grads(device, reentrant, True),
                                                 checkpointed_grads("cpu", reentrant, True), strict=True))


@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpoint_on_sky_without_preserving_the_generator_runs(device: torch.device, reentrant: bool) -> None:
    grads = checkpointed_grads(device, reentrant, False)
    assert all(torch.isfinite(g).all() for g in grads)


def test_autocast_on_sky_casts_as_cuda_does(device: torch.device) -> None:
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    sa = a.to(device).requires_grad_()
    with torch.autocast("sky", dtype=torch.bfloat16):
        y = sa @ b.to(device)
        probs = y.softmax(-1)
    assert y.dtype == torch.bfloat16 and probs.dtype == torch.float32
    assert torch.equal(y.cpu(), a.bfloat16() @ b.bfloat16())
    probs.sum().backward()
    assert sa.grad.dtype == torch.float32
    assert torch.autocast("sky").fast_dtype in torch.sky.get_amp_supported_dtype()


def test_device_count_current_device_synchronize_and_memory(device: torch.device) -> None:
    assert torch.sky.is_available() and torch.sky.device_count() > device.index
    with torch.sky.device(device.index):
        assert torch.sky.current_device() == device.index
    before = torch.sky.memory_allocated(device)
    big = torch.ones(1 << 18, device=device)  # 1 MiB on the node
    torch.sky.synchronize(device)
    assert torch.sky.memory_allocated(device) - before == 1 << 20
    del big
    assert torch.sky.memory_allocated(device) == before
