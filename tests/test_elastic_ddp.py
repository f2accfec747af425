"""A DDP training function that checkpoints survives the loss of a node: a broadcast with
``retries`` on a ``replace_lost`` pool waits for the replacement, restarts every worker (the
torch plugin re-forms the process group, the head's address as MASTER_ADDR, a replaced head
included) and runs again; the function loads its own checkpoint and ends with exactly the
weights of a run that was never interrupted (real torch.distributed, gloo, Local workers)."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import skyward as sky
from skyward import events as ev

STEPS = 6
KILL_AT = 3  # the step at whose start the chosen node's worker is killed (the first time only)
PER_RANK = 4


@sky.compute
def train(checkpoint: str, marker: str, kill_node: int | None) -> list[float]:
    """Plain DDP: resume from ``checkpoint`` if it is there, save it after every step (rank 0).
    At step KILL_AT the worker of node ``kill_node`` kills itself, once (``marker``)."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Linear(5, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    start = 0
    if os.path.exists(checkpoint):
        state = torch.load(checkpoint)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
    ddp = DistributedDataParallel(model)
    gen = torch.Generator().manual_seed(1234)
    xs = torch.randn(STEPS, world * PER_RANK, 5, generator=gen)
    ys = xs @ torch.randn(5, 3, generator=gen)
    for step in range(start, STEPS):
        if step == KILL_AT and sky.instance_info().node == kill_node and not os.path.exists(marker):
            Path(marker).touch()
            os.kill(os.getpid(), signal.SIGKILL)
        part = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
        optimizer.zero_grad()
        loss = ((ddp(xs[step, part]) - ys[step, part]) ** 2).mean()
        loss.backward()
        optimizer.step()
        if rank == 0:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step + 1},
                       checkpoint + ".part")
            os.replace(checkpoint + ".part", checkpoint)
        dist.barrier()
    return [float(v) for p in model.parameters() for v in p.detach().flatten()]


@pytest.fixture
def files() -> Iterator[str]:
    prefix = f"/tmp/skyward-ddp-{uuid.uuid4().hex[:10]}"
    yield prefix
    for f in Path("/tmp").glob(Path(prefix).name + "*"):
        f.unlink(missing_ok=True)


@pytest.mark.parametrize("kill_node", [1, 0], ids=["worker-lost", "head-lost"])
def test_ddp_resumes_from_its_checkpoint_to_the_same_weights(files: str, kill_node: int) -> None:
    events: list[ev.Event] = []
    keep = (ev.NodeAdded, ev.NodeRemoved, ev.TaskRetried)
    with sky.ComputePool(nodes=(2, 2), plugins=[sky.plugins.torch(backend="gloo")], console=False, idle_timeout=5,
                         on_event=lambda e: events.append(e) if isinstance(e, keep) else None) as pool:
        uninterrupted = train(f"{files}-a.pt", f"{files}-a.killed", None) @ pool
        resumed = train(f"{files}-b.pt", f"{files}-b.killed", kill_node).with_options(retries=1) @ pool
        assert Path(f"{files}-b.killed").exists()  # the node was lost mid-training
        assert pool.nodes == 2
    assert uninterrupted[0] == uninterrupted[1] and resumed[0] == resumed[1]  # DDP: one model
    assert resumed[0] == pytest.approx(uninterrupted[0], abs=1e-6)
    assert [(type(e).__name__, getattr(e, "node", None)) for e in events] == [
        ("NodeRemoved", kill_node), ("NodeAdded", kill_node), ("TaskRetried", None)]
    assert events[2].lost_node == kill_node and (events[2].attempt, events[2].attempts) == (2, 2)
