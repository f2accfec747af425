"""A user's program with a large Local pool, as tests/faults/test_scale.py runs it:
``python scale_client.py NODES IDLE_TIMEOUT MARKER``.

It opens a pool of NODES Local nodes, writes ``MARKER`` (the number of nodes that answered a
broadcast) once every node has, and holds until the test ends it from outside (SIGKILL, or
SIGINT while the pool is still starting). Its workers inherit its environment, so they carry
the test's ``SKYWARD_FAULT_TAG``.
"""

from __future__ import annotations

import os
import sys
import time

import skyward as sky


@sky.compute
def node_number() -> int:
    return sky.instance_info().node


def main() -> None:
    nodes, idle_timeout, marker = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    with sky.ComputePool(nodes=nodes, idle_timeout=idle_timeout, start_timeout=600, console=False) as pool:
        print("open", flush=True)
        answered = len(set(node_number() @ pool))
        with open(f"{marker}.part", "w") as f:
            f.write(str(answered))
        os.replace(f"{marker}.part", marker)
        time.sleep(3600)


if __name__ == "__main__":
    main()
