"""The DDP training loop both launchers run: a small MLP on a fixed batch, gloo, CPU.

Under torchrun (every rank runs this file; rank 0 prints the result line)::

    torchrun --nnodes=1 --nproc_per_node=2 bench/ddp_script.py --steps 200 --windows 5

Under Skyward the same ``train`` function is called inside a ``@sky.compute`` task on a pool
with ``sky.plugins.torch()``, which has already initialised the process group (see
``cases.py: ddp_skyward``).

``train`` measures only the training loop: ``warmup`` steps, a barrier, then ``windows`` timed
windows of ``steps`` steps each. Each window's steps/s is reported by rank 0. The launchers
differ in everything around the loop (process start, rendezvous, environment), and the loop
itself runs under whatever that environment is (thread settings included), which is the point.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

#: Model and batch: small enough that gradient all-reduce is a real share of each step.
IN, HIDDEN, OUT, BATCH = 256, 512, 10, 64


def train(steps: int = 200, windows: int = 5, warmup: int = 30, seed: int = 0) -> dict:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                          nn.Linear(HIDDEN, OUT))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(seed + rank)
    x = torch.randn(BATCH, IN, generator=gen)
    y = torch.randint(0, OUT, (BATCH,), generator=gen)

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(x), y)
        loss.backward()  # DDP all-reduces the gradients here
        opt.step()
        return loss

    for _ in range(warmup):
        step()
    dist.barrier()
    rates = []
    for _ in range(windows):
        t = time.perf_counter()
        for _ in range(steps):
            loss = step()
        dist.barrier()
        rates.append(steps / (time.perf_counter() - t))
    return {
        "rank": rank,
        "world": world,
        "steps_per_s": rates,
        "loss": float(loss.detach()),
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "params": sum(p.numel() for p in model.parameters()),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=30)
    args = parser.parse_args()
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        result = train(args.steps, args.windows, args.warmup)
    finally:
        dist.destroy_process_group()
    if result["rank"] == 0:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from _common import emit_result

        emit_result(result)


if __name__ == "__main__":
    main()
