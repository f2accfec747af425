"""Managed training from Python on the Local provider: a broadcast DDP loop (real gloo, the torch
plugin's process group) that checkpoints under its ``SKYPILOT_TASK_ID`` resumes after one of its
nodes is SIGKILLed, on a new cluster, with the same task id on every node and every run; and a
managed job's log is followed as it is written (``ManagedJob.logs(follow=True)`` and
``skyward jobs logs ID``), ending when the job ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import skyward as sky
from skyward.clusters.state import ClusterStore
from skyward.jobs import client
from tests.test_cluster_cli import ROOT
from tests.test_cluster_jobs import until
from tests.test_managed_jobs import home, nothing_left  # noqa: F401 (home: a fixture)

STEPS, HELD_AT = 6, 2  # the first run stops after step HELD_AT (its checkpoint written) and is killed there


@sky.compute
def train(out: str) -> dict:
    """Each rank: a DDP step per batch, rank 0 checkpointing after each under the task's id; the
    first run holds after step HELD_AT (each rank says so with a file) until it is killed."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    task = os.environ["SKYPILOT_TASK_ID"]
    folder = Path(out, task)
    folder.mkdir(exist_ok=True)
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    checkpoint, start = folder / "ckpt.pt", 0
    if checkpoint.exists():
        saved = torch.load(checkpoint)
        model.load_state_dict(saved["model"])
        start = saved["step"] + 1
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(start, STEPS):
        data = torch.Generator().manual_seed(100 * step + rank)  # (each rank its own batch)
        loss = ddp(torch.randn(8, 4, generator=data)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with open(folder / f"steps{rank}", "a") as f:
            f.write(f"{step}\n")
        if rank == 0:
            torch.save({"model": model.state_dict(), "step": step}, folder / "ckpt.part")
            os.replace(folder / "ckpt.part", checkpoint)
        dist.barrier()  # (the checkpoint is written before any rank goes on)
        if step == HELD_AT:
            (folder / f"held{rank}").touch()
            while True:  # (until this run is killed)
                time.sleep(0.05)
    weights = torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()
    return {"rank": rank, "world": dist.get_world_size(), "start": start, "task": task,
            "skyward_task": os.environ["SKYWARD_TASK_ID"], "weights": weights}


def test_a_ddp_training_call_resumes_from_its_checkpoint_after_a_lost_node(home: str, tmp_path: Path) -> None:
    job = sky.jobs.launch(train(str(tmp_path)), nodes=2, broadcast=True, provider=sky.Local(),
                          plugins=[sky.plugins.torch(backend="gloo")])
    task = client.get(job.id).task_id
    def held() -> bool:
        return all((tmp_path / task / f"held{r}").exists() for r in (0, 1))

    until(lambda: held() or job.status not in ("PENDING", "STARTING", "RUNNING"), 90, "both ranks to hold at step 2")
    assert held() and job.status == "RUNNING", (job.status, job.logs())
    os.kill(ClusterStore().get(job.cluster).workers[1][0], signal.SIGKILL)  # node 1's worker, its rank with it
    ranks = job.result(timeout=120)
    assert job.status == "SUCCEEDED" and client.get(job.id).recoveries == 1
    assert [(r["rank"], r["world"], r["start"]) for r in ranks] == [(0, 2, HELD_AT + 1), (1, 2, HELD_AT + 1)]
    assert {r["task"] for r in ranks} == {r["skyward_task"] for r in ranks} == {task}  # every node, every run
    assert ranks[0]["weights"] == ranks[1]["weights"]  # DDP kept the ranks' models equal
    for rank in (0, 1):  # no step run twice: the second run went on where the checkpoint left off
        assert (tmp_path / task / f"steps{rank}").read_text().split() == [str(s) for s in range(STEPS)]
    nothing_left(home)


@sky.compute
def talks(out: str) -> str:
    print("first line, while running", flush=True)
    while not Path(out, "go").exists():
        time.sleep(0.05)
    print("last line", flush=True)
    return "done"


def test_a_running_jobs_log_is_followed_as_it_is_written_until_the_job_ends(home: str, tmp_path: Path) -> None:
    job = sky.jobs.launch(talks(str(tmp_path)))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    commands = {"cli": [sys.executable, "-m", "skyward.cli", "jobs", "logs", str(job.id)],
                "python": [sys.executable, "-c", f"import skyward as sky; sky.jobs.get({job.id}).logs(follow=True)"]}
    followers = {name: subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for name, command in commands.items()}
    seen: dict[str, list[str]] = {name: [] for name in followers}
    readers = [threading.Thread(target=lambda name=name: seen[name].extend(iter(followers[name].stdout.readline, "")),
                                daemon=True) for name in followers]  # type: ignore[union-attr]
    for reader in readers:
        reader.start()
    try:
        until(lambda: all(any("first line, while running" in line for line in seen[name]) for name in seen)
              or job.status != "RUNNING" and job.status not in ("PENDING", "STARTING"), 60, "the first line")
        assert job.status == "RUNNING", seen  # (held until "go": every follower had the line while it ran)
        assert all(any("first line" in line for line in lines) for lines in seen.values()), seen
        (tmp_path / "go").touch()
        for name, follower in followers.items():
            assert follower.wait(60) == 0, seen[name]
        for reader in readers:
            reader.join(10)
        assert all(any("last line" in line for line in lines) for lines in seen.values()), seen
        assert job.status == "SUCCEEDED" and job.result(5) == "done"
    finally:
        for follower in followers.values():
            if follower.poll() is None:
                follower.kill()
                follower.wait()
    nothing_left(home)
