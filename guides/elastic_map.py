"""An elastic map: the pool grows while work waits, shrinks when idle, and a lost node's task
runs again elsewhere.

``nodes=(1, 3)`` starts one node. A burst of tasks waits in the client for a free slot; once
the oldest has waited ``scale_up_after`` seconds the pool adds the nodes the queue needs (up
to 3). A node with nothing to do for ``scale_down_after`` seconds is released, down to 1.
``@sky.compute(retries=1)`` runs a task again when its node is lost (here one task kills its
own worker, once); ``replace_lost`` (on by default for a ``(min, max)`` pool) brings a new
node up in its place.

    python guides/elastic_map.py
"""

import os
import signal
import tempfile
import time

import skyward as sky
from skyward import events as ev


@sky.compute
def work(i: int) -> int:
    time.sleep(0.5)  # a short task: a burst of them keeps one node busy for a while
    return i * i


@sky.compute(retries=1)
def fragile(i: int, marker: str) -> int:
    """The first run kills its own worker (as a lost machine would); the retry returns."""
    if not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    return i * i


def main() -> None:
    changes: list[str] = []

    def note(event: ev.Event) -> None:
        if isinstance(event, (ev.NodeAdded, ev.NodeRemoved)):
            changes.append(f"{type(event).__name__}({event.node}, {event.reason!r})")

    with sky.ComputePool(nodes=(1, 3), scale_up_after=1.0, scale_down_after=3.0, on_event=note) as pool:
        results = pool.map(work, range(24))  # the burst: the pool grows to 3
        print(f"every result, in order: {results == [i * i for i in range(24)]}; nodes now: {pool.nodes}")
        time.sleep(5)  # the lull: idle nodes are released, down to 1
        print(f"after the lull: {pool.nodes} node(s)")
        with tempfile.TemporaryDirectory() as tmp:
            value = fragile(7, os.path.join(tmp, "lost-once")) >> pool  # its node is lost once
        pool.wait_ready(timeout=60)  # the lost node's replacement is up
        print(f"the retried task returned {value}: {value == 49}; nodes: {pool.nodes}")
    print("\n".join(changes))


if __name__ == "__main__":
    main()
