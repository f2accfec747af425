"""A small GPT trained with DistributedDataParallel: one process per slot, started by torchrun.

Written for Skyward's ``examples/mingpt`` (the shape of a minGPT training script, kept tiny):
a decoder-only transformer learns a synthetic next-token rule, so a run takes seconds on CPUs.
It reads what torchrun sets (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``)
and uses NCCL on GPUs, gloo otherwise.

The script checks that training really spans every node, and exits non-zero if not:

* ``WORLD_SIZE`` equals ``SKYPILOT_NUM_NODES x LOCAL_WORLD_SIZE`` when the launcher set it;
* an ``all_reduce`` of one-hot rank vectors sees every rank;
* after training, every rank holds the same weights (DDP kept them in step).

Rank 0 prints ``mingpt: first step at <unix time>`` after the first optimizer step and
``mingpt: steps/s=<x>`` over the steps after the first few (bench/launch_vs_torchrun.py
reads both). ``MINGPT_STEPS`` (default 40) sets the number of steps.
"""

from __future__ import annotations

import math
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel

VOCAB = 32
BLOCK = 16
WARMUP = 5  # steps not counted in steps/s (first-step costs: allocation, DDP's bucket set-up)


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then an MLP."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, width: int = 48, layers: int = 2, heads: int = 4):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, width)
        self.pos = nn.Parameter(torch.zeros(1, BLOCK, width))
        self.blocks = nn.Sequential(*(Block(width, heads) for _ in range(layers)))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCAB, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos[:, : idx.shape[1]]
        return self.head(self.ln(self.blocks(x)))


def batch(generator: torch.Generator, size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences following next = (3 * token + 1) mod VOCAB from a random start: learnable."""
    start = torch.randint(0, VOCAB, (size, 1), generator=generator)
    seq = [start]
    for _ in range(BLOCK):
        seq.append((3 * seq[-1] + 1) % VOCAB)
    data = torch.cat(seq, dim=1).to(device)
    return data[:, :-1], data[:, 1:]


def check(condition: bool, message: str) -> None:
    if not condition:
        print(f"mingpt: FAILED: {message}", file=sys.stderr, flush=True)
        sys.exit(3)


def main() -> None:
    steps = int(os.environ.get("MINGPT_STEPS", "40"))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank, local_world = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{local_rank}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)  # several ranks may share a few cores
    dist.init_process_group("nccl" if cuda else "gloo")

    nodes = os.environ.get("SKYPILOT_NUM_NODES")
    if nodes is not None:
        check(world == int(nodes) * local_world,
              f"WORLD_SIZE={world}, expected {nodes} nodes x {local_world} process(es)")
    seen = torch.zeros(world, device=device)
    seen[rank] = 1.0
    dist.all_reduce(seen)
    check(bool((seen == 1).all()), f"all_reduce saw {seen.tolist()}")
    if rank == 0:
        print(f"mingpt: world of {world} rank(s) on {nodes or '?'} node(s); all_reduce saw ranks "
              f"{[i for i in range(world) if seen[i] == 1]}", flush=True)

    torch.manual_seed(0)  # the same initial weights everywhere (DDP also broadcasts rank 0's)
    model = DistributedDataParallel(TinyGPT().to(device), device_ids=[local_rank] if cuda else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(1000 + rank)  # each rank its own data
    timed_from = None
    for step in range(1, steps + 1):
        x, y = batch(generator, 32, device)
        loss = F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step == 1 and rank == 0:
            print(f"mingpt: first step at {time.time():.6f}", flush=True)
        if step == WARMUP:
            timed_from = time.perf_counter()
        if rank == 0 and (step % 10 == 0 or step == steps):
            print(f"mingpt: step {step} loss {loss.item():.4f}", flush=True)
    if cuda:
        torch.cuda.synchronize()
    if timed_from is not None and steps > WARMUP and rank == 0:
        print(f"mingpt: steps/s={(steps - WARMUP) / (time.perf_counter() - timed_from):.2f}", flush=True)

    checksum = torch.stack([p.detach().double().sum() for p in model.parameters()]).sum().reshape(1)
    low, high = checksum.clone(), checksum.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    check(math.isclose(low.item(), high.item(), rel_tol=1e-9, abs_tol=1e-9), "ranks hold different weights")
    if rank == 0:
        print(f"mingpt: done: {steps} steps across {world} rank(s), final loss {loss.item():.4f}, "
              "weights identical on every rank", flush=True)
    dist.barrier()  # no rank tears down its connections while another still uses them
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # The run is over and checked. Leave without the interpreter's exit-time teardown: with
    # gloo, torch 2.13's C++ destructors can abort the process there ("terminate called
    # without an active exception", seen under plain torchrun too), turning a good run into
    # a failed one.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
