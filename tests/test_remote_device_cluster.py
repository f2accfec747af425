"""Copies between two nodes' devices land by the next sync point, on either device: a model
deep-copied to another node is there, whole, when the trainer's next value comes back; on the
Local provider, real worker processes."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import skyward as sky  # noqa: E402
from skyward.torch import Cluster, Compute  # noqa: E402


@sky.compute
def bytes_held() -> int:
    """Bytes of the tensors this worker's sky sessions hold (looked at on the node, not asked of
    the device: no sync point of its own)."""
    from skyward.testing import device_sessions

    seen = {}
    for session in device_sessions():
        for t in list(session.tensors.values()):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def test_a_deepcopy_moved_to_another_node_lands_before_the_next_sync_point() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256))
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    x = torch.randn(4, 256)
    with Cluster(Compute(provider=sky.Local()), Compute(provider=sky.Local())) as (trainer, ref):
        model.to(trainer.device())
        before = bytes_held() >> ref.pool
        ref_model = copy.deepcopy(model).to(ref.device())
        assert {p.device for p in ref_model.parameters()} == {ref.device()}
        model(x.to(trainer.device())).sum().item()  # a sync point on the trainer only
        assert (bytes_held() >> ref.pool) - before >= size  # the copy is on the other node
        for p, q in zip(model.parameters(), ref_model.parameters(), strict=True):
            assert torch.equal(p.cpu(), q.cpu())
