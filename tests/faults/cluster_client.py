"""A user's program on a named cluster, as the fault matrix runs it: ``python cluster_client.py CONFIG``.

``phase`` is ``creating`` (the cluster is new: a plugin's ``around_app`` holds its first start)
or ``attached`` (the cluster exists: this program attaches and a task holds on every node).
Reaching the phase, a node writes ``<marker>-<phase>-<node>`` holding its worker's pid; then
the test applies the exit path from outside, or the program applies it itself (``return``).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time

import skyward as sky


def reached(marker: str, phase: str) -> None:
    node = sky.instance_info().node
    with open(f"{marker}-{phase}-{node}.part", "w") as f:
        f.write(str(os.getpid()))
    os.replace(f"{marker}-{phase}-{node}.part", f"{marker}-{phase}-{node}")


def hold_at_start(marker: str) -> sky.Plugin:
    @contextlib.contextmanager
    def around_app(info):
        reached(marker, "creating")
        time.sleep(3600)
        yield

    return sky.Plugin("hold", around_app=around_app)


@sky.compute
def hold(marker: str, seconds: float) -> str:
    reached(marker, "attached")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:  # (polling: a cancelled task stops at once)
        time.sleep(0.01)
    return "held"


def provider(cfg: dict) -> sky.SSH | None:
    if "ssh" not in cfg:
        return None
    s = cfg["ssh"]
    return sky.SSH(s["hosts"], user=s["user"], key=s["key"], known_hosts=s["known_hosts"],
                   find_links=[s["wheelhouse"]], no_index=True, connect_timeout=5)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    phase, marker = cfg["phase"], cfg["marker"]
    if phase == "creating":
        with sky.ComputePool(name=cfg["name"], provider=provider(cfg), nodes=2, idle_timeout=3.0,
                             plugins=[hold_at_start(marker)], console=False):
            print("started", flush=True)
        return
    seconds = 0.5 if cfg["path"] == "return" else 3600
    try:
        with sky.ComputePool(name=cfg["name"], idle_timeout=3.0, console=False) as pool:
            print(hold(marker, seconds) @ pool, flush=True)
        print("detached", flush=True)
    except sky.WorkerLost as exc:
        print(f"WorkerLost: {exc}", flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
