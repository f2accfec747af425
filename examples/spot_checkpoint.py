"""Save a training loop's state before a spot machine is taken back.

Each node trains, and registers a checkpoint with ``sky.on_preempt``: when EC2's two-minute
interruption notice reaches the node, the callback saves the state on a thread of its own,
and the loop, which looks at ``sky.instance_info().preempting`` between steps, stops cleanly.
A later run resumes from the checkpoint.

    python examples/spot_checkpoint.py              # Local: no notice ever comes, it runs through
    SKYWARD_EXAMPLE_AWS=1 python examples/spot_checkpoint.py   # two spot machines on AWS

On AWS the checkpoint is written on the machine's own disk, which goes with it: a real job
writes it somewhere that stays (S3, a shared file system) in ``save``.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import threading
import time

import skyward as sky
from skyward import events


@sky.compute
def train(steps: int, directory: str) -> dict:
    info = sky.instance_info()
    path = os.path.join(directory, f"node{info.node}.pkl")
    lock = threading.Lock()  # the callback's thread and the loop both touch the state
    state = {"step": 0, "weight": 0.0}
    os.makedirs(directory, exist_ok=True)
    if os.path.exists(path):  # resume
        with open(path, "rb") as f:
            state = pickle.load(f)

    def save(notice: sky.Preemption | None = None) -> None:
        with lock:
            snapshot = dict(state)
        with open(path + ".part", "wb") as f:
            pickle.dump(snapshot, f)
        os.replace(path + ".part", path)
        if notice is not None:
            print(f"node {info.node}: saved step {snapshot['step']}, {notice.seconds_left:.0f}s before {notice.action}")

    sky.on_preempt(save)  # once, on its own thread, when the interruption notice arrives
    while state["step"] < steps:
        notice = info.preempting
        if notice is not None and notice.kind == "interruption":
            return {"node": info.node, "stopped_at": state["step"], "preempted": True}
        with lock:
            state["weight"] += 0.5 * (1.0 - state["weight"])  # one "step" of training
            state["step"] += 1
        time.sleep(0.01)
    save()
    return {"node": info.node, "stopped_at": state["step"], "preempted": False}


def main() -> None:
    provider = sky.AWS(allocation="spot") if os.environ.get("SKYWARD_EXAMPLE_AWS") else None
    directory = os.path.join(tempfile.gettempdir(), "skyward-spot-checkpoint")

    def told(event: events.Event) -> None:
        if isinstance(event, events.NodePreempting):
            print(f"the client knows: node {event.node} gets a {event.kind} notice ({event.action} at {event.at})")

    with sky.ComputePool(provider=provider, nodes=2, on_event=told) as pool:
        results = train(200, directory) @ pool
    for r in results:
        print(f"node {r['node']}: step {r['stopped_at']}" + (" (preempted, resume later)" if r["preempted"] else ""))
    print("every node reached its last step or saved before its machine went:",
          all(r["stopped_at"] == 200 or r["preempted"] for r in results))


if __name__ == "__main__":
    main()
