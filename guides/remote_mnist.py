"""SkyTorch's MNIST example on a remote ``sky`` device: the loop is ordinary PyTorch, the tensors
live on a pool's node, and this process only streams the operations to it.

The data is synthetic and MNIST-shaped (1x28x28 images, ten classes: a fixed pattern per class
plus noise), so nothing is downloaded; swap in ``torchvision.datasets.MNIST`` for the real set.
The same steps then run on this machine's CPU, and the two models are compared: on a CPU node
the remote device gives the very same parameters.
"""

from __future__ import annotations

import asyncio
import copy
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

import skyward as sky
from skyward.torch import Compute, compute


class MNISTNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(nn.functional.relu(self.conv2(nn.functional.relu(self.conv1(x)))))
        return self.fc2(nn.functional.relu(self.fc1(torch.flatten(x, 1))))


def synthetic_mnist(n: int, seed: int = 0) -> TensorDataset:
    """``n`` noisy images of ten fixed patterns, normalised as MNIST is."""
    g = torch.Generator().manual_seed(seed)
    patterns = torch.rand(10, 1, 28, 28, generator=g)
    labels = torch.randint(0, 10, (n,), generator=g)
    images = (patterns[labels] + 0.5 * torch.rand(n, 1, 28, 28, generator=g)).clamp(0, 1)
    return TensorDataset((images - 0.1307) / 0.3081, labels)


def train(model: nn.Module, device: torch.device | str, loader: DataLoader, epochs: int) -> float:
    """The loop of SkyTorch's MNIST example, unchanged: the device decides where it runs."""
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.002)
    for _ in range(epochs):
        model.train()
        for data, target in loader:
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(data), target)
            loss.backward()
            optimizer.step()
    return loss.item()  # the one value the loop reads back: a sync point


@compute(name="mnist", provider=sky.Local())  # a GPU: provider=sky.AWS(...), accelerator="A10G"
async def main(node: Compute, epochs: int = 1) -> None:
    device = node.device("cpu")  # "cuda" on a GPU node
    loader = DataLoader(synthetic_mnist(2048), batch_size=256, shuffle=True,
                        generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    model = MNISTNet()
    twin = copy.deepcopy(model)  # the same steps here, on this machine's CPU, to compare

    started = time.perf_counter()
    loss = train(model, device, loader, epochs)
    print(f"on {device}, node 0's CPU: loss {loss:.4f} in {time.perf_counter() - started:.1f} s")
    print("the parameters live on the node:", {str(p.device) for p in model.parameters()})

    loader.generator.manual_seed(1)  # (the same shuffles)
    started = time.perf_counter()
    local_loss = train(twin, "cpu", loader, epochs)
    print(f"on this CPU: loss {local_loss:.4f} in {time.perf_counter() - started:.1f} s")
    same = all(torch.equal(p.cpu(), q) for p, q in zip(model.parameters(), twin.parameters()))
    print(f"same parameters as the local run: {same}")


if __name__ == "__main__":
    asyncio.run(main(epochs=1))
