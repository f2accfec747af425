"""DDP with ``@sky.integrations.torch``, a DistributedSampler, and metrics averaged over ranks.

The decorator does at call time what the torch plugin does at worker start: it exports
``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``, ``RANK``... and initialises the process
group (once per worker; later calls reuse it). Use it when the pool carries no torch plugin.

The dataset is built here, on the client, and passed as an argument: broadcasting with ``@``
serializes it once and every node receives all of it. ``DistributedSampler`` then gives each
rank its own part, reshuffled every epoch by ``set_epoch``. Each rank only sees its part, so
the loss and accuracy it measures are local; ``all_reduce`` sums them over the ranks so that
the head prints figures for the whole dataset.

    python guides/ddp_distributed.py
"""

import torch

import skyward as sky


def make_dataset(n: int, seed: int, features: int = 16, classes: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` points whose class follows a hidden non-linear rule (the same rule for any seed)."""
    rule = torch.Generator().manual_seed(1234)
    w1, w2 = torch.randn(features, 8, generator=rule), torch.randn(8, classes, generator=rule)
    x = torch.randn(n, features, generator=torch.Generator().manual_seed(seed))
    y = (torch.tanh(x @ w1) @ w2).argmax(dim=1)
    return x, y


@sky.compute
@sky.integrations.torch(backend="gloo")  # below @sky.compute: it runs on the worker, before the body
@sky.stdout(only="head")
def train(x: torch.Tensor, y: torch.Tensor, x_val: torch.Tensor, y_val: torch.Tensor, epochs: int = 6) -> dict:
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    world_size = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(x.shape[1], 64), nn.ReLU(), nn.Linear(64, 3))
    if dist.is_initialized():  # the same code also runs as one plain process (train.local(...))
        model = DDP(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = nn.CrossEntropyLoss(reduction="sum")

    train_set, val_set = TensorDataset(x, y), TensorDataset(x_val, y_val)
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(train_set, batch_size=64, sampler=sampler)
    # Evaluation: every rank scores its own part of the validation set, no shuffling, no padding.
    val_loader = DataLoader(
        val_set, batch_size=256,
        sampler=DistributedSampler(val_set, num_replicas=world_size, rank=rank, shuffle=False, drop_last=True),
    )

    def global_metrics(loss_sum: float, correct: int, count: int) -> tuple[float, float]:
        # [sum of losses, correct predictions, samples] summed over every rank.
        totals = torch.tensor([loss_sum, float(correct), float(count)], dtype=torch.float64)
        if dist.is_initialized():
            dist.all_reduce(totals, op=dist.ReduceOp.SUM)
        return (totals[0] / totals[2]).item(), (totals[1] / totals[2]).item()

    for epoch in range(epochs):
        sampler.set_epoch(epoch)  # without it, every epoch would see the same order
        model.train()
        loss_sum, correct, count = 0.0, 0, 0
        for batch_x, batch_y in loader:
            logits = model(batch_x)
            loss = loss_fn(logits, batch_y)
            optimizer.zero_grad()
            (loss / len(batch_y)).backward()
            optimizer.step()
            loss_sum += loss.item()
            correct += (logits.argmax(dim=1) == batch_y).sum().item()
            count += len(batch_y)
        train_loss, train_acc = global_metrics(loss_sum, correct, count)

        model.eval()
        loss_sum, correct, count = 0.0, 0, 0
        with torch.no_grad():
            for batch_x, batch_y in val_loader:
                logits = model(batch_x)
                loss_sum += loss_fn(logits, batch_y).item()
                correct += (logits.argmax(dim=1) == batch_y).sum().item()
                count += len(batch_y)
        val_loss, val_acc = global_metrics(loss_sum, correct, count)
        print(f"epoch {epoch}: train loss {train_loss:.3f} acc {train_acc:.1%} | "
              f"val loss {val_loss:.3f} acc {val_acc:.1%}")

    return {"rank": rank, "samples_seen_per_epoch": len(sampler), "val_accuracy": val_acc}


if __name__ == "__main__":
    x, y = make_dataset(6000, seed=0)
    x_val, y_val = make_dataset(2000, seed=1)  # held out: same rule, new points

    with sky.ComputePool(nodes=2) as pool:  # no plugin: the decorator sets up torch.distributed
        results = train(x, y, x_val, y_val) @ pool

    for r in results:
        print(f"rank {r['rank']}: trained on {r['samples_seen_per_epoch']} samples per epoch, "
              f"global val accuracy {r['val_accuracy']:.1%}")
