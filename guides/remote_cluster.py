"""SkyTorch's weight-sync example: a policy model trains on one node, a reference copy lives on
another, and after every step the weights go from the first to the second, node to node.

The model is a small causal language model built from a config (a 2-layer GPT-2, nothing
downloaded). Its weights cross between the nodes' workers over a channel the pool sets up (this
process sees none of those bytes: the script prints what it received from the two nodes).
"""

from __future__ import annotations

import asyncio
import copy

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel

import skyward as sky
from skyward.torch import Cluster, Compute


def received(*computes: Compute) -> int:
    """Bytes this process has read from the computes' workers (everything: results, errors...)."""
    return sum(c.pool._connection(0).received_bytes for c in computes)


async def main(steps: int = 5) -> None:
    transformers.logging.set_verbosity_error()  # (no notes about the config's defaults)
    async with Cluster(
        Compute(name="trainer", provider=sky.Local()),  # e.g. provider=sky.AWS(...), accelerator="A100"
        Compute(name="reference", provider=sky.Local()),
    ) as (trainer, reference):
        trainer_device = trainer.device("cpu")  # "cuda" on GPU nodes
        reference_device = reference.device("cpu")

        torch.manual_seed(0)
        config = GPT2Config(n_layer=2, n_head=4, n_embd=128, vocab_size=512, n_positions=64,
                            bos_token_id=0, eos_token_id=0)
        model = GPT2LMHeadModel(config)
        size = sum(p.numel() * p.element_size() for p in model.parameters())
        model.to(trainer_device)
        ref_model = copy.deepcopy(model).to(reference_device)  # node to node
        print(f"model: {size / 2**20:.1f} MiB of weights, on {trainer_device} and {reference_device}")

        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        tokens = torch.randint(0, config.vocab_size, (8, 32), generator=torch.Generator().manual_seed(1))
        before = received(trainer, reference)
        for step in range(steps):
            batch = tokens.to(trainer_device)
            optimizer.zero_grad()
            loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
            optimizer.step()
            # sync the weights from the trainer to the reference: node to node, not through here
            for p, ref_p in zip(model.parameters(), ref_model.parameters()):
                ref_p.data.copy_(p.data)
            print(f"step {step}: loss {loss.item():.4f}")
        synced = received(trainer, reference) - before
        print(f"weights synced {steps} times ({steps * size / 2**20:.1f} MiB); this process received "
              f"{synced / 1024:.1f} KiB from the nodes meanwhile")

        same = all(torch.equal(p.cpu(), q.cpu()) for p, q in zip(model.parameters(), ref_model.parameters()))
        print(f"reference equals the trained model: {same}")


if __name__ == "__main__":
    asyncio.run(main())
