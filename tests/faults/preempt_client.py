"""A user's program for the fault matrix's spot preemption cases: ``python preempt_client.py CONFIG``.

It opens a 2-node AWS spot pool (moto's EC2, the instances the SSH test hosts) and broadcasts
a task that registers a ``sky.on_preempt`` callback, then works. The test gives node 1 a spot
interruption notice (the stand-in IMDS in its host's namespace): node 1's callback writes
``<marker>-checkpoint-1`` (holding its process id) and the program, told by a
``NodePreempting`` event, writes ``<marker>-told-<node>`` and prints a line. Then the exit
path: ``return`` (node 1's task returns once its checkpoint is written, node 0's at once),
``exception`` (node 1's task raises after its checkpoint), or a signal the test sends while
both tasks hold (``SIGINT``, ``SIGKILL``).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import skyward as sky
from skyward import events as ev


@sky.compute
def checkpoint_then(marker: str, path: str) -> int:
    node = sky.instance_info().node
    saved = threading.Event()

    def checkpoint(notice: sky.Preemption) -> None:
        with open(f"{marker}-checkpoint-{node}", "w") as f:
            f.write(str(os.getpid()))
        saved.set()

    sky.on_preempt(checkpoint)
    with open(f"{marker}-registered-{node}", "w") as f:
        f.write(str(os.getpid()))
    if path in ("return", "exception"):
        if node == 0:
            return node
        saved.wait(120)
        if path == "exception":
            raise ValueError("node 1 saved its checkpoint and stops")
        return node
    time.sleep(3600)
    return node


def main() -> None:
    cfg = json.loads(sys.argv[1])
    marker, path = cfg["marker"], cfg["path"]
    from skyward.providers.aws.provider import AWS

    def told(event: ev.Event) -> None:
        if isinstance(event, ev.NodePreempting):
            print(f"told: node {event.node} {event.kind} {event.action}", flush=True)
            with open(f"{marker}-told-{event.node}", "w") as f:
                f.write(event.kind)

    with sky.ComputePool(provider=AWS(**cfg["aws"]), nodes=2, idle_timeout=3, console=False,
                         on_event=told) as pool:
        print("open", flush=True)
        assert checkpoint_then(marker, path) @ pool == [0, 1]
    print("closed", flush=True)


if __name__ == "__main__":
    main()
