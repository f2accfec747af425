"""Round trip of a no-op task on a warm 1-node Local pool against two raw pipe floors, quickly.

    python bench/roundtrip_local.py [--calls 300] [--blocks 10]

A shortcut to section 1 of ``python bench/run.py``: Skyward's ``noop() >> pool`` and two pipe
floors (two processes ping-ponging a small pickled tuple over pipes), all warm, in alternating
blocks in one process:

- the *blocking* floor: each end blocks in ``read`` (bimodal, and slower than Skyward itself on
  a small VM: waking a blocked reader costs more than the trip);
- the *fair* floor ("floor-polled"): each end polls its pipe for up to 50 µs before it blocks,
  as Skyward's worker and a caller of ``>>`` do.

Prints p50/p99 and Skyward's ratio to each floor (to the fair floor's median, and to the
blocking floor's median and fastest block, the stricter reading when that floor is bimodal).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import loadavg, percentile
from run import run_case, skyward_from


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300, help="calls per block")
    parser.add_argument("--blocks", type=int, default=10)
    args = parser.parse_args()
    print(f"skyward from {skyward_from()}; load average at start: {loadavg()}")
    r = run_case("rt", {"systems": ["floor", "floor-polled", "skyward"], "calls": args.calls, "blocks": args.blocks,
                              "warmup": 200})
    if "error" in r:
        print(r["error"], r.get("stderr", ""), file=sys.stderr)
        return 1
    blocks = r["blocks"]
    p50 = {s: percentile([x for c in b for x in c], 50) * 1e6 for s, b in blocks.items()}
    for s, b in blocks.items():
        print(f"{s:12s} p50 {p50[s]:8.1f} µs  p99 {percentile([x for c in b for x in c], 99) * 1e6:8.1f} µs")
    sky_blocks = [percentile(b, 50) for b in blocks["skyward"]]
    fastest = min(percentile(b, 50) for b in blocks["floor"])
    print(f"Skyward ÷ fair (polled) floor (p50): {p50['skyward'] / p50['floor-polled']:.2f}×  (target ≤ 3×)")
    print(f"Skyward ÷ blocking floor (p50): {p50['skyward'] / p50['floor']:.2f}×;  median block ÷ that floor's "
          f"fastest block ({fastest * 1e6:.1f} µs): {percentile(sky_blocks, 50) / fastest:.2f}×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
