"""Operations on a ``sky`` device against the CPU: PyTorch's own operator database walked whole
(float32, forward and backward, a sample per operation), and the metadata, bits, errors and
custom operators it needs to pass; on the Local provider, real worker processes."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("expecttest")  # (torch.testing._internal imports it)

import skyward as sky  # noqa: E402
from skyward.torch import Compute  # noqa: E402
from tests import sky_op_walk  # noqa: E402

EXPECTED = pathlib.Path(__file__).parent / "data" / "sky_ops_expected_failures.txt"


@pytest.fixture(scope="module")
def device() -> Iterator[torch.device]:
    with Compute(provider=sky.Local()) as node:
        yield node.device("cpu")


def expected_failures() -> dict[str, tuple[str, str]]:
    """name -> (pass, verdict), from the committed list."""
    found = {}
    for line in EXPECTED.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, rest = line.split(": ", 1)
            which, verdict = rest.split(":", 1)[0].split()
            found[name] = (which, verdict)
    return found


@pytest.mark.timeout(600)
def test_the_operator_database_runs_on_sky_as_on_the_cpu(device: torch.device, record_property: object) -> None:
    verdicts = sky_op_walk.walk(device)
    figures = sky_op_walk.figures(verdicts)
    print(figures)
    record_property("coverage", figures)  # type: ignore[operator]
    expected = expected_failures()
    unexpected, fixed = [], []
    for v in verdicts:
        failed = v.forward != "ok" or v.backward not in ("ok", "none")
        if v.name in expected:
            which, verdict = expected[v.name]
            if getattr(v, which) != verdict:
                fixed.append(f"{v.name}: listed as {which} {verdict}, now forward {v.forward}, backward {v.backward}")
        elif failed:
            unexpected.append(f"{v.name}: forward {v.forward}, backward {v.backward}: {v.why}")
    assert not unexpected, "\n".join(unexpected)
    assert not fixed, "\n".join(fixed)
    assert not any("wrong" in (v.forward, v.backward) for v in verdicts)  # no wrong value, ever


def test_strides_the_node_produced_replace_the_meta_kernels(device: torch.device) -> None:
    a = torch.randn(5, 5)
    for _ in range(2):
        vectors = torch.linalg.eig(a.to(device)).eigenvectors
        torch.sky.synchronize()  # (the node's answer carries its word on the strides)
        assert vectors.stride() == torch.linalg.eig(a).eigenvectors.stride()
    right_away = torch.linalg.eig(a.to(device)).eigenvectors  # (the plan learned it)
    assert right_away.stride() == torch.linalg.eig(a).eigenvectors.stride()
    assert right_away.mT.reshape(-1).view(5, 5).shape == (5, 5)
    x = torch.randn(6, 4)
    v = torch.svd(x.to(device)).V
    v.sum().item()
    assert v.stride() == torch.svd(x).V.stride()


def test_shapes_the_node_produced_replace_the_meta_kernels(device: torch.device) -> None:
    x, w, b = torch.randn(4, 2, 3), torch.ones(2), torch.zeros(2)
    mean, var = torch.zeros(2), torch.ones(2)
    cpu = torch.native_batch_norm(x, w, b, mean, var, False, 0.1, 1e-5)
    here = torch.native_batch_norm(*(t.to(device) for t in (x, w, b, mean, var)), False, 0.1, 1e-5)
    assert here[0].sum().item() == pytest.approx(cpu[0].sum().item(), abs=1e-5)
    assert [tuple(t.shape) for t in here] == [tuple(t.shape) for t in cpu]  # save_mean: (0,) in eval mode


def test_conjugate_and_negative_bits_travel(device: torch.device) -> None:
    z = torch.randn(4, dtype=torch.complex64)
    c = z.to(device).conj()
    assert c.is_conj() and torch.equal(c.cpu(), z.conj())
    assert torch.equal(c.resolve_conj().cpu(), z.conj().resolve_conj())
    n = torch._neg_view(z.to(device))
    assert n.is_neg() and torch.equal(n.cpu(), -z)
    x = torch.randn(6).to(device).requires_grad_()
    torch.fft.hfft(x).sum().backward()  # (its backward views a conjugate as real)
    assert x.grad is not None and x.grad.shape == (6,)


def test_small_non_contiguous_tensors_travel_both_ways(device: torch.device) -> None:
    x = torch.randn(3, 4)
    s = x.to(device)
    assert torch.equal(s[:1, 0].cpu(), x[:1, 0])
    assert torch.equal(torch.tensor(2.0).to(device).expand(1).cpu(), torch.tensor([2.0]))
    t = x.t().to(device)  # a transpose goes as it is laid out, and keeps its strides
    assert t.stride() == x.t().stride() and torch.equal(t.cpu(), x.t())


def test_operations_whose_meta_kernel_cannot_answer_run_on_the_node(device: torch.device) -> None:
    x = torch.arange(4.0)
    assert torch.allclose(x.to(device), x.to(device) + 1e-9)
    repeats = torch.tensor([1, 0, 2, 1])
    assert torch.equal(torch.repeat_interleave(x.to(device), repeats.to(device)).cpu(),
                       torch.repeat_interleave(x, repeats))


def test_errors_read_as_the_devices_own_and_name_the_operation(device: torch.device) -> None:
    with pytest.raises(RuntimeError, match=r"mat1 and mat2 shapes cannot be multiplied \(3x4 and 5x6\)") as info:
        torch.ones(3, 4, device=device) @ torch.ones(5, 6, device=device)
    assert "aten.mm" in str(info.value)
    assert torch.ones(2, device=device).sum().item() == 2.0  # the device goes on


def test_custom_operators_registered_here_run_on_the_node(device: torch.device) -> None:
    @torch.library.custom_op("skywardtest::scaled_shift", mutates_args=())
    def scaled_shift(x: torch.Tensor, k: float) -> torch.Tensor:
        return x * 3 + k

    x = torch.randn(5)
    assert torch.equal(torch.ops.skywardtest.scaled_shift(x.to(device), 0.5).cpu(), x * 3 + 0.5)

    @scaled_shift.register_fake
    def _(x: torch.Tensor, k: float) -> torch.Tensor:
        return torch.empty_like(x)

    queued = torch.ops.skywardtest.scaled_shift(x.to(device), 1.0)  # (now planned here, queued)
    assert torch.equal(queued.cpu(), x * 3 + 1.0)


def test_sparse_tensors_are_refused_at_once_naming_the_layout(device: torch.device) -> None:
    dense = torch.eye(3)
    with pytest.raises(NotImplementedError, match="sparse"):
        dense.to_sparse().to(device)
    with pytest.raises(NotImplementedError, match="sparse_csr"):
        dense.to_sparse_csr().to(device)
    with pytest.raises(NotImplementedError, match="sparse"):
        dense.to(device).to_sparse()
