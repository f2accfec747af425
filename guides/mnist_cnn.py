"""An MNIST-shaped CNN trained with DDP on two nodes, on synthetic digits.

The network has the classic MNIST layout: two 3x3 convolutions over 1x28x28 images, max
pooling, and two fully connected layers down to 10 classes. Instead of downloading MNIST,
each "digit" class is a fixed random 28x28 pattern and every image is its class pattern
plus heavy noise, so there is a real signal to learn and the script needs no network.
The torch plugin sets up the process group; DDP averages the gradients.

    python guides/mnist_cnn.py

On GPUs: ``sky.ComputePool(provider=sky.AWS(), accelerator="A100", nodes=2,
plugins=[sky.plugins.torch(vision="latest")])`` and ``.to("cuda")`` for model and batches.
"""

import torch
import torch.nn as nn

import skyward as sky


class DigitNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, kernel_size=3), nn.ReLU(),   # 32 x 26 x 26
            nn.Conv2d(32, 64, kernel_size=3), nn.ReLU(),  # 64 x 24 x 24
            nn.MaxPool2d(2),                              # 64 x 12 x 12 = 9216
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(9216, 128), nn.ReLU(), nn.Linear(128, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def synthetic_digits(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` noisy 1x28x28 images of 10 classes (the class patterns are the same for any seed)."""
    patterns = torch.randn(10, 1, 28, 28, generator=torch.Generator().manual_seed(42))
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=generator)
    images = patterns[labels] + 2.0 * torch.randn(n, 1, 28, 28, generator=generator)
    return images, labels


@sky.compute
@sky.stdout(only="head")
def train(epochs: int = 3, batch_size: int = 64) -> dict:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world_size = dist.get_rank(), dist.get_world_size()
    # Each rank makes its own, different training images (seed = rank); the test set is shared.
    images, labels = synthetic_digits(768, seed=rank)
    test_images, test_labels = synthetic_digits(500, seed=1000)

    torch.manual_seed(0)
    model = DDP(DigitNet())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    for epoch in range(epochs):
        model.train()
        order = torch.randperm(len(images), generator=torch.Generator().manual_seed(epoch))
        for start in range(0, len(images), batch_size):
            batch = order[start:start + batch_size]
            loss = nn.functional.cross_entropy(model(images[batch]), labels[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        # Each rank scores its own slice of the test set; all_reduce adds up the counts.
        model.eval()
        with torch.no_grad():
            mine = slice(rank, None, world_size)
            hits = (model(test_images[mine]).argmax(dim=1) == test_labels[mine]).sum()
        totals = torch.stack([hits.float(), torch.tensor(float(len(test_labels[mine])))])
        dist.all_reduce(totals, op=dist.ReduceOp.SUM)
        accuracy = (totals[0] / totals[1]).item()
        print(f"epoch {epoch}: last batch loss {loss.item():.3f}, test accuracy {accuracy:.1%} "
              f"({world_size} ranks x {len(images)} images)")

    return {"rank": rank, "test_accuracy": accuracy, "final_loss": loss.item()}


if __name__ == "__main__":
    with sky.ComputePool(nodes=2, plugins=[sky.plugins.torch()]) as pool:
        results = train() @ pool

    for r in results:
        print(f"rank {r['rank']}: final loss {r['final_loss']:.3f}, test accuracy {r['test_accuracy']:.1%}")
