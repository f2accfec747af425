"""Round trip of a no-op task on a warm 1-node Local pool, against the raw pipe floor, quickly.

    python bench/roundtrip_local.py [--calls 300] [--blocks 10]

A shortcut to section 1 of ``python bench/run.py`` (which also measures Ray, Dask and
ProcessPoolExecutor and writes docs/benchmarks.md): the floor (two processes ping-ponging a
small pickled tuple over pipes), the floor with the thread hand-offs Skyward used to have, Skyward and Skyward without spinning,
alternating block by block in one process. Prints p50/p99 and the ratio to the floor.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import percentile  # noqa: E402
from run import run_case  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=300, help="calls per block")
    parser.add_argument("--blocks", type=int, default=10)
    args = parser.parse_args()
    systems = ["floor", "floor_spin", "floor_both_hops", "skyward", "skyward_nospin"]
    r = run_case("rt_local", {"systems": systems, "calls": args.calls, "blocks": args.blocks, "warmup": 200})
    if "error" in r:
        print(r["error"], r.get("stderr", ""), file=sys.stderr)
        return 1
    floor = None
    for s in systems:
        samples = [x for block in r["blocks"][s] for x in block]
        p50, p99 = percentile(samples, 50) * 1e6, percentile(samples, 99) * 1e6
        floor = floor or p50
        cost = r["per_call"][s]
        print(f"{s:16s} p50 {p50:8.1f} µs  p99 {p99:8.1f} µs  {p50 / floor:5.2f}× floor   "
              f"CPU/call client {cost['client_cpu_us']:5.1f} µs, server {cost['server_cpu_us']:5.1f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
