"""The checks of ``scripts/gpu-check.sh``: the CUDA paths that no CPU machine exercises.

``python scripts/gpu_check.py CHECK`` runs one check and prints one line,
``RESULT <check> ok|FAILED|skipped <figures or reason>``, exiting 1 when it failed:

- ``ddp``: ``sky.plugins.torch(backend="nccl")`` on a Local pool of one node with one worker
  process per GPU; an all_reduce on each process's own ``cuda:LOCAL_RANK``.
- ``slices``: two Local nodes sharing the host, each given its half of the GPUs through
  ``CUDA_VISIBLE_DEVICES`` (the torch plugin's slices); the halves must not overlap.
- ``mingpt``: ``skyward launch examples/mingpt/train.yaml --gpus NAME:N`` on Local; torchrun
  must start one rank per GPU, and training must finish.
- ``mnist``: SkyTorch's MNIST example on ``node.device("cuda")`` against the same steps on the
  GPU directly: steps/s of each and their ratio, and the final losses close.
- ``ops``: a walk over common operations on ``node.device("cuda")``, each compared with the same
  operation on the GPU directly.

``--cpu`` runs the same code on CPU (gloo, ``"cpu"`` devices) to try the checks on a machine
without a GPU; ``slices`` is then skipped.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "guides"))

import skyward as sky  # noqa: E402


def gpu_count() -> int:
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False).stdout
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


@sky.compute
def reduce_on_my_device(cpu: bool) -> dict:
    import torch
    import torch.distributed as dist

    local = int(os.environ["LOCAL_RANK"])
    device = torch.device("cpu") if cpu else torch.device("cuda", local)
    t = torch.tensor([float(dist.get_rank() + 1)], device=device)
    dist.all_reduce(t)
    return {"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": float(t.item()),
            "backend": dist.get_backend(), "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "bus": "" if cpu else torch.cuda.get_device_properties(device).pci_bus_id}


def check_ddp(cpu: bool, gpus: int) -> str:
    backend = "gloo" if cpu else "nccl"
    with sky.ComputePool(nodes=1, processes_per_node=gpus, console=False,
                         plugins=[sky.plugins.torch(backend=backend, timeout=120)]) as pool:
        results = reduce_on_my_device(cpu) @ pool
    world = gpus
    want = world * (world + 1) / 2
    problems = [f"rank {r['rank']}: world {r['world']}, sum {r['sum']}, backend {r['backend']}"
                for r in results if r["world"] != world or r["sum"] != want or r["backend"] != backend]
    buses = {r["bus"] for r in results}
    if not cpu and len(buses) != world:
        problems.append(f"{world} ranks on {len(buses)} distinct GPU(s)")
    if problems:
        raise AssertionError("; ".join(problems))
    return f"{world} process(es), {backend}, all_reduce sum {want:g}"


def check_slices(cpu: bool, gpus: int) -> str:
    if cpu or gpus < 2:
        raise SkipCheck("needs two GPUs or more" if not cpu else "CUDA_VISIBLE_DEVICES slices need GPUs")
    per_node = gpus // 2
    with sky.ComputePool(nodes=2, processes_per_node=per_node, console=False,
                         plugins=[sky.plugins.torch(backend="nccl", timeout=120)]) as pool:
        results = reduce_on_my_device(False) @ pool
    by_node: dict[int, set[str]] = {}
    for r in results:
        by_node.setdefault(r["rank"] // per_node, set()).add(r["visible"] or "")
    buses = [r["bus"] for r in results]
    problems = []
    if len(set(buses)) != len(buses):
        problems.append(f"processes share a GPU: {buses}")
    if any(len(v) != 1 for v in by_node.values()):
        problems.append(f"a node's processes see different devices: {by_node}")
    if problems:
        raise AssertionError("; ".join(problems))
    slices = ", ".join(f"node {n}: {sorted(v)[0]}" for n, v in sorted(by_node.items()))
    return f"2 nodes x {per_node}, CUDA_VISIBLE_DEVICES {slices}"


def accelerator_name() -> str:
    """A name ``--gpus`` accepts for this card (the Local provider only reports it)."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                         text=True, check=False).stdout
    for name in ("H200", "H100", "A100", "L40S", "L4", "A10G", "T4", "V100"):
        if name in out:
            return name
    return "A100"


def check_mingpt(cpu: bool, gpus: int) -> str:
    gpu_flag = [] if cpu else ["--gpus", f"{accelerator_name()}:{gpus}"]
    cmd = [sys.executable, "-m", "skyward.cli", "launch", "examples/mingpt/train.yaml", "--num-nodes", "1",
           *gpu_flag, "--env", "MINGPT_STEPS=30", "--yes"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=480,
                          env={**os.environ, "SKYWARD_CONSOLE": "plain"})
    text = done.stdout + done.stderr
    world = re.search(r"world of (\d+) rank", text)
    rate = re.search(r"steps/s=([\d.]+)", text)
    want = 1 if cpu else gpus
    if done.returncode != 0 or world is None or int(world.group(1)) != want or "mingpt: done" not in text:
        seen = world.group(1) if world else "?"
        raise AssertionError(f"exit {done.returncode}, {seen} rank(s) for {want} GPU(s): {text[-600:]}")
    return f"{want} rank(s), {rate.group(1) if rate else '?'} steps/s"


def check_mnist(cpu: bool, gpus: int) -> str:
    import torch
    from remote_mnist import MNISTNet, synthetic_mnist
    from torch import nn

    from skyward.torch import Compute

    kind = "cpu" if cpu else "cuda"
    data = synthetic_mnist(256 * 4)
    batches = [(data.tensors[0][i:i + 256], data.tensors[1][i:i + 256]) for i in range(0, 1024, 256)]

    def steps(model: nn.Module, device: torch.device | str, n: int) -> tuple[float, float]:
        model.to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.002)
        on_device = [(x.to(device), y.to(device)) for x, y in batches]
        loss = None
        started = time.perf_counter()
        for i in range(n):
            x, y = on_device[i % len(on_device)]
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
        value = loss.item()  # the sync point
        return n / (time.perf_counter() - started), value

    torch.manual_seed(0)
    direct, remote = MNISTNet(), MNISTNet()
    remote.load_state_dict(direct.state_dict())
    n = 10 if cpu else 40
    with Compute(provider=sky.Local()) as node:
        device = node.device(kind)
        steps(remote, device, 3)  # warm-up
        sky_rate, sky_loss = steps(remote, device, n)
    steps(direct, kind, 3)
    direct_rate, direct_loss = steps(direct, kind, n)
    if not (abs(sky_loss - direct_loss) <= 1e-2 * max(1.0, abs(direct_loss))):
        raise AssertionError(f"final loss {sky_loss:.5f} on sky, {direct_loss:.5f} on {kind}")
    return (f"{kind} directly {direct_rate:.1f} steps/s, node.device({kind!r}) {sky_rate:.1f} steps/s, "
            f"ratio {sky_rate / direct_rate:.2f}")


def check_ops(cpu: bool, gpus: int) -> str:
    import torch

    from skyward.torch import Compute

    kind = "cpu" if cpu else "cuda"
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(16, 16, generator=g), torch.randn(16, 16, generator=g)
    ops = {
        "add": lambda x, y: x + y, "mul": lambda x, y: x * y, "matmul": lambda x, y: x @ y,
        "sum": lambda x, y: x.sum(dim=1), "mean": lambda x, y: x.mean(), "max": lambda x, y: x.max(dim=0).values,
        "softmax": lambda x, y: x.softmax(dim=-1), "relu": lambda x, y: x.relu(), "tanh": lambda x, y: x.tanh(),
        "exp": lambda x, y: x.exp(), "where": lambda x, y: torch.where(x > 0, x, y),
        "index": lambda x, y: x[2:, ::3], "t+contiguous": lambda x, y: x.t().contiguous(),
        "cat": lambda x, y: torch.cat([x, y]), "sort": lambda x, y: x.sort(dim=1).values,
        "cumsum": lambda x, y: x.cumsum(0), "half": lambda x, y: x.half().float(),
        "masked": lambda x, y: x[x > 0.5], "nonzero": lambda x, y: torch.nonzero(x > 1.0),
        "conv2d": lambda x, y: torch.nn.functional.conv2d(x.view(1, 1, 16, 16), y[:3, :3].reshape(1, 1, 3, 3)),
        "cross_entropy": lambda x, y: torch.nn.functional.cross_entropy(x, (y.abs() * 100).long()[:, 0] % 16),
    }
    failed = []
    with Compute(provider=sky.Local()) as node:
        device = node.device(kind)
        sa, sb = a.to(device), b.to(device)
        da, db = a.to(kind), b.to(kind)
        for name, op in ops.items():
            try:
                got, want = op(sa, sb).cpu(), op(da, db).cpu()
                if got.shape != want.shape or not torch.allclose(got.float(), want.float(), rtol=1e-4, atol=1e-5):
                    failed.append(f"{name}: differs")
            except Exception as exc:  # one line per operation: the walk goes on
                failed.append(f"{name}: {type(exc).__name__}: {str(exc)[:80]}")
    if failed:
        raise AssertionError(f"{len(failed)} of {len(ops)} operations: " + "; ".join(failed))
    return f"{len(ops)} operations on node.device({kind!r}) equal to {kind} directly"


class SkipCheck(Exception):
    pass


CHECKS = {"ddp": check_ddp, "slices": check_slices, "mingpt": check_mingpt, "mnist": check_mnist, "ops": check_ops}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("check", choices=sorted(CHECKS))
    parser.add_argument("--cpu", action="store_true", help="run on CPU (gloo), to try the check without a GPU")
    args = parser.parse_args()
    gpus = 2 if args.cpu else gpu_count()
    started = time.monotonic()
    try:
        figures = CHECKS[args.check](args.cpu, gpus)
    except SkipCheck as exc:
        print(f"RESULT {args.check} skipped {exc}", flush=True)
        return 0
    except Exception as exc:
        print(f"RESULT {args.check} FAILED {type(exc).__name__}: {exc}".replace("\n", " "), flush=True)
        return 1
    print(f"RESULT {args.check} ok {figures} ({time.monotonic() - started:.0f}s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
