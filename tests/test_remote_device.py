"""The remote ``sky`` torch device (skyward.torch) on the Local provider: tensors live on the
node's worker, the client streams operations; results bit-exact against the same code on the
client's CPU.

Internals on purpose, through ``skyward.testing``: the client's device records and the node's
sessions are read to check what no public call shows: that nothing accumulates, and which
peer a copy goes to."""

from __future__ import annotations

import asyncio
import copy
import io
import os
import pathlib
import signal
import sys
import time

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import skyward as sky  # noqa: E402
from skyward.torch import Compute, compute  # noqa: E402
from skyward.testing import device_record  # noqa: E402

# SkyTorch's MNIST example's network, as the guide defines it (guides/remote_mnist.py; its main() runs only as a script)
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "guides"))
from remote_mnist import MNISTNet  # noqa: E402


def mnist_batches(n: int, batch: int = 32, seed: int = 1) -> list[tuple]:
    """Synthetic MNIST-shaped data (no download): normalised images and labels."""
    g = torch.Generator().manual_seed(seed)
    return [((torch.rand(batch, 1, 28, 28, generator=g) - 0.1307) / 0.3081, torch.randint(0, 10, (batch,), generator=g))
            for _ in range(n)]


def train(model, device, batches) -> list[float]:  # type: ignore[no-untyped-def]
    """SkyTorch's MNIST example's loop: AdamW, cross_entropy; the losses read back every step."""
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=0.002)
    losses = []
    for data, target in batches:
        data, target = data.to(device), target.to(device)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(data), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def same_parameters(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(p.detach().cpu(), q.detach().cpu()) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def test_mnist_steps_on_sky_equal_the_same_steps_on_the_cpu() -> None:
    torch.manual_seed(0)
    local = MNISTNet()
    remote = copy.deepcopy(local)
    batches = mnist_batches(4)
    with Compute(provider=sky.Local()) as node:
        device = node.device("cpu")
        assert device == torch.device("sky", device.index)
        remote_losses = train(remote, device, batches)
        assert {p.device for p in remote.parameters()} == {device}
        local_losses = train(local, "cpu", batches)
        assert remote_losses == local_losses
        assert same_parameters(remote, local)


def test_async_form_with_the_decorator() -> None:
    batches = mnist_batches(2)

    @compute(name="mnist", provider=sky.Local())
    async def run(node: Compute, epochs: int = 1) -> tuple[list[float], dict]:
        device = node.device("cpu")
        torch.manual_seed(0)
        model = MNISTNet()
        losses: list[float] = []
        for _ in range(epochs):
            losses += train(model, device, batches)
        return losses, {k: v.cpu() for k, v in model.state_dict().items()}

    losses, state = asyncio.run(run(epochs=2))
    torch.manual_seed(0)
    local = MNISTNet()
    expected = train(local, "cpu", batches) + train(local, "cpu", batches)
    assert losses == expected
    assert all(torch.equal(state[k], v) for k, v in local.state_dict().items())


def test_sync_decorator_on_a_plain_function_closes_the_node_even_when_it_raises() -> None:
    seen = {}

    @compute(provider=sky.Local())
    def run(node: Compute) -> None:
        seen["pool"] = node.pool
        t = torch.ones(3, device=node.device())
        seen["t"] = t
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        run()
    assert not seen["pool"].is_open
    with pytest.raises(sky.DeviceError, match="closed"):
        (seen["t"] + 1).sum().item()


def test_pool_device_per_node_keeps_each_nodes_operations_apart() -> None:
    with sky.ComputePool(nodes=2, console=False) as pool:
        d0, d1 = pool.device("cpu", node=0), pool.device("cpu", node=1)
        assert d0 != d1 and pool.device("cpu", node=0) == d0
        a = torch.arange(6.0).to(d0)
        b = torch.arange(6.0).to(d1) * 10
        a.mul_(2)
        assert a.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
        assert b.tolist() == [0.0, 10.0, 20.0, 30.0, 40.0, 50.0]
        pids = {node: pid for node, pid in enumerate(pool.worker_pids())}

        @sky.compute
        def tensors_here() -> dict:
            import os

            from skyward.testing import device_sessions

            return {"pid": os.getpid(), "sessions": {s.index: len(s.tensors) for s in device_sessions()}}

        found = tensors_here() @ pool
        assert [f["pid"] for f in found] == [pids[0], pids[1]]
        assert list(found[0]["sessions"]) == [d0.index] and list(found[1]["sessions"]) == [d1.index]
        with pytest.raises(sky.DeviceError, match="expected all tensors on one device"):
            a + b
        with pytest.raises(sky.ConfigError, match="node"):
            pool.device("cpu", node=2)


def test_tensor_semantics_match_the_cpu() -> None:
    x = torch.arange(24.0).reshape(4, 6)
    with Compute() as node:
        d = node.device()
        s = x.to(d)
        assert torch.equal(s[1:, ::2].cpu(), x[1:, ::2])  # views and slicing
        assert torch.equal(s.t().contiguous().cpu(), x.t().contiguous())
        t, u = s.clone(), x.clone()
        t[0] += 5
        t.mul_(2)
        t[:, 1].zero_()
        u[0] += 5
        u.mul_(2)
        u[:, 1].zero_()
        assert torch.equal(t.cpu(), u)  # in-place, through views
        assert s.tolist() == x.tolist()
        assert bool((s > 22).any()) and not bool((s > 23).any())
        assert f"{s.sum():.1f}" == f"{x.sum():.1f}"
        assert torch.equal((s * torch.tensor(2.0)).cpu(), x * 2)  # a client 0-dim tensor with sky ones
        assert torch.equal(s[s > 5].cpu(), x[x > 5])  # output shape known only from the data
        assert torch.equal(torch.nonzero(s > 20).cpu(), torch.nonzero(x > 20))
        assert torch.zeros(2, 3, device=d).sum().item() == 0.0
        assert torch.arange(0, 1, 0.25, device=d).tolist() == [0.0, 0.25, 0.5, 0.75]
        assert s.to(torch.float16).cpu().dtype == torch.float16
        assert s.to("cpu", torch.float64).dtype == torch.float64
        values, indices = s.sort(dim=1, descending=True)
        assert torch.equal(values.cpu(), x.sort(dim=1, descending=True).values)
        assert "device='sky:" in repr(s) and "23." in repr(s)
        torch.manual_seed(3)
        first = torch.randn(5, device=d).cpu()
        torch.manual_seed(3)
        assert torch.equal(torch.randn(5, device=d).cpu(), first)
        torch.manual_seed(3)
        assert torch.equal(torch.randn(5), first)  # the node's generator, seeded as the client's


@pytest.mark.parametrize("options", [{"foreach": True}, {"foreach": False}, {"fused": True}])
def test_optimizers_state_dict_deepcopy_and_save(options: dict) -> None:
    torch.manual_seed(0)
    x = torch.randn(8, 4)
    with Compute() as node:
        d = node.device()
        remote = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        local = copy.deepcopy(remote)
        remote = remote.to(d)
        twin = copy.deepcopy(remote)  # a copy on the node
        assert {p.device for p in twin.parameters()} == {d} and same_parameters(twin, remote)
        for model, inp in ((remote, x.to(d)), (local, x)):
            opt = torch.optim.AdamW(model.parameters(), lr=0.01, **options)
            for _ in range(3):
                opt.zero_grad()
                model(inp).pow(2).mean().backward()
                opt.step()
        assert same_parameters(remote, local)
        assert not same_parameters(twin, remote)  # the copy is its own
        twin.load_state_dict(remote.state_dict())
        assert same_parameters(twin, remote)
        buffer = io.BytesIO()
        torch.save(remote.state_dict(), buffer)
        buffer.seek(0)
        saved = torch.load(buffer)
        assert all(v.device.type == "cpu" for v in saved.values())
        assert all(torch.equal(saved[k], v) for k, v in local.state_dict().items())


def test_what_is_not_supported_says_so() -> None:
    with Compute() as node:
        s = torch.ones(3, device=node.device())
        with pytest.raises(NotImplementedError, match="pin_memory"):
            s.pin_memory()
        with pytest.raises(NotImplementedError, match="data_ptr"):
            s.data_ptr()
        with pytest.raises(NotImplementedError, match="torch.Generator"):
            torch.randn(3, device=node.device(), generator=torch.Generator())
        with pytest.raises(TypeError, match="numpy"):
            s.numpy()


def test_errors_name_the_operation_and_come_at_the_next_sync_point() -> None:
    with Compute() as node:
        d = node.device()
        s = torch.arange(6.0).to(d)
        with pytest.raises(RuntimeError, match="same reduction dim|cannot be multiplied"):
            s.view(2, 3) @ s.view(2, 3)  # known from the shapes: raised at once, as torch does
        bad = s.index_select(0, torch.tensor([0, 9]).to(d))  # only the node can tell: queued
        with pytest.raises(sky.DeviceError, match=r"aten\.index_select\.default failed: IndexError") as info:
            bad.sum().item()
        assert info.value.op == "aten.index_select.default"
        assert "index out of range" in "".join(getattr(info.value, "__notes__", []))  # the remote traceback
        assert s.sum().item() == 15.0  # the device goes on
        with pytest.raises(sky.DeviceError, match="has no 'cuda' device; it has: cpu"):
            node.device("cuda")


def test_a_training_step_costs_one_round_trip_per_sync_point() -> None:
    torch.manual_seed(0)
    with Compute() as node:
        d = node.device()
        dev = device_record(d)
        model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).to(d)
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        x, y = torch.randn(16, 32).to(d), torch.randint(0, 10, (16,)).to(d)
        calls = []
        real_call = dev.link.call
        dev.link.call = lambda fn, args: calls.append(fn.__name__) or real_call(fn, args)  # count round trips
        ops_before = dev.sent_ops
        for _ in range(5):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            loss.item()
        assert calls == ["run"] * 5
        assert dev.sent_ops - ops_before > 5 * 30  # dozens of operations per step, in those 5 trips


def test_a_thousand_steps_leave_the_nodes_table_flat() -> None:
    @sky.compute
    def table_size() -> int:
        from skyward.testing import device_sessions

        return sum(len(s.tensors) for s in device_sessions())

    torch.manual_seed(0)
    with Compute() as node:
        d = node.device()
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to(d)
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        x, y = torch.randn(8, 16).to(d), torch.randint(0, 4, (8,)).to(d)
        sizes = []
        for step in range(1000):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            if step in (99, 999):
                torch.sky.synchronize()
                sizes.append(table_size() >> node.pool)
        assert sizes[1] == sizes[0] and sizes[0] < 40, sizes


def test_a_node_killed_during_a_step_raises_worker_lost() -> None:
    with Compute() as node:
        d = node.device()
        model = nn.Linear(256, 256).to(d)
        x = torch.randn(64, 256).to(d)
        assert model(x).sum().item() is not None
        os.kill(node.pool.worker_pids()[0], signal.SIGKILL)
        deadline = time.monotonic() + 20
        with pytest.raises(sky.WorkerLost, match="SIGKILL"):
            while time.monotonic() < deadline:
                model(x).sum().item()


def test_a_compute_gives_its_node_the_clients_torch() -> None:
    from skyward.accelerators import Accelerator
    from skyward.plugins._base import PoolInfo
    from skyward.torch._device import torch_in_image

    version = torch.__version__.split("+")[0]
    cpu = torch_in_image(sky.Image(), PoolInfo(nodes=1))
    assert cpu.pip == (f"torch=={version}", "numpy") and cpu.pip_indexes == ("https://download.pytorch.org/whl/cpu",)
    gpu = torch_in_image(sky.Image(), PoolInfo(nodes=1, accelerator=Accelerator("A100")))
    assert gpu.pip[0] == f"torch=={version}" and gpu.pip_indexes == ("https://download.pytorch.org/whl/cu128",)
    own = sky.Image(pip=["torch==2.5.1"])
    assert torch_in_image(own, PoolInfo(nodes=1)) is own  # the image's own pin is left alone
