"""Basic DDP training on two nodes: the torch plugin sets up the process group for you.

Every node runs the same function. ``sky.plugins.torch()`` has already called
``torch.distributed.init_process_group`` on each worker, so the function is an ordinary
DistributedDataParallel loop: a ``DistributedSampler`` gives each rank its half of the data,
DDP averages the gradients during ``backward()``, and every rank ends with the same weights.

Runs on this machine's CPU (two Local nodes, gloo backend)::

    python guides/ddp_basic.py

Each node runs one worker process (one rank) here; ``processes_per_node=K`` gives each node K
ranks, as ``torchrun --nproc_per_node=K`` does (one per GPU is the default with this plugin
on GPU nodes): ``train() @ pool`` then returns one result per rank, in rank order.

For GPUs in the cloud, change only the pool: ``provider=sky.AWS(), accelerator="A100"``
(the plugin then installs CUDA wheels and picks NCCL) and move model and batches to "cuda".
"""

import skyward as sky


@sky.compute
@sky.stdout(only="head")  # one copy of the epoch log, from rank 0
def train(epochs: int = 8) -> dict:
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    rank, world_size = dist.get_rank(), dist.get_world_size()

    # The same synthetic data on every rank (fixed seed); the sampler picks this rank's part.
    # Labels follow a hidden linear rule, so there is something to learn.
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 32, generator=generator)
    y = (x @ torch.randn(32, 4, generator=generator)).argmax(dim=1)
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=128, sampler=sampler)

    torch.manual_seed(0)  # reproducible runs (DDP copies rank 0's initial weights to all ranks anyway)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    print(f"training on {world_size} ranks, {len(sampler)} of {len(dataset)} samples each")
    for epoch in range(epochs):
        sampler.set_epoch(epoch)  # a different shuffle every epoch, agreed by all ranks
        for batch_x, batch_y in loader:
            loss = loss_fn(model(batch_x), batch_y)
            optimizer.zero_grad()
            loss.backward()  # DDP averages the gradients across ranks here
            optimizer.step()
        print(f"epoch {epoch}: loss={loss.item():.4f}")

    # DDP kept the replicas in sync, so this checksum is the same on every rank.
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    return {"rank": rank, "final_loss": loss.item(), "checksum": checksum}


if __name__ == "__main__":
    # 2 nodes x 1 process: 2 ranks (processes_per_node=2 would make it 4, two per node).
    with sky.ComputePool(nodes=2, processes_per_node=1, plugins=[sky.plugins.torch(backend="gloo")]) as pool:
        results = train() @ pool  # one result per rank, in rank order

    for r in results:
        print(f"rank {r['rank']}: final loss on its last batch {r['final_loss']:.4f}")
    print("same weights on every rank:", len({r["checksum"] for r in results}) == 1)
