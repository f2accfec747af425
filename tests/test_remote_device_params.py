"""Parameters keep their identity through ``model.to(sky)``: weights tied across modules stay one
tensor (through deepcopy and torch.save too), so a language model with tied embeddings trains on
``sky`` as on the CPU; on the Local provider, real worker processes."""

from __future__ import annotations

import copy
import io

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import skyward as sky  # noqa: E402
from skyward.torch import Compute  # noqa: E402


def tiny_gpt2() -> transformers.GPT2LMHeadModel:
    """A two-layer GPT-2 with tied embeddings, made offline from its config (no download)."""
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=16,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                                     eos_token_id=0, tie_word_embeddings=True)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


def tied(model: transformers.GPT2LMHeadModel) -> bool:
    return model.lm_head.weight is model.transformer.wte.weight


def train(model: torch.nn.Module, ids: torch.Tensor, steps: int = 3) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_tied_embeddings_stay_tied_on_sky_and_train_as_on_the_cpu() -> None:
    local = tiny_gpt2()
    remote = copy.deepcopy(local)
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    with Compute(provider=sky.Local()) as node:
        device = node.device("cpu")
        moved = remote.to(device)
        assert moved is remote and tied(remote)
        assert len(list(remote.parameters())) == len(list(local.parameters()))
        assert isinstance(remote.lm_head.weight, torch.nn.Parameter)
        remote_losses = train(remote, ids.to(device))
        local_losses = train(local, ids)
        assert tied(remote)
        # (the same kernels in the same order, but not all of the CPU's fused paths: equal to
        # rounding, far inside what untied embeddings drift by)
        assert remote_losses == pytest.approx(local_losses, rel=1e-6)
        for (name, p), q in zip(remote.named_parameters(), local.parameters(), strict=True):
            torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-4, atol=1e-6, msg=name)
        twin = copy.deepcopy(remote)
        assert tied(twin) and twin.lm_head.weight.device == device
        buffer = io.BytesIO()
        torch.save(remote, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
        assert tied(loaded) and isinstance(loaded.lm_head.weight, torch.nn.Parameter)
        assert loaded.lm_head.weight.device.type == "cpu"
