"""Round trip of a no-op task on a warm 1-node Local pool against the raw pipe floor, quickly.

    python bench/roundtrip_local.py [--calls 300] [--blocks 10]

A shortcut to section 1 of ``python bench/run.py``: Skyward's ``noop() >> pool`` and the
blocking pipe floor (two processes ping-ponging a small pickled tuple over pipes), both warm,
in alternating blocks in one process. Prints p50/p99, the ratio to the floor, and the ratio to
the floor's fastest block (the stricter reading when the floor is bimodal; see the method notes
of docs/benchmarks.md).
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
    r = run_case("rt", {"systems": ["floor", "skyward"], "calls": args.calls, "blocks": args.blocks,
                              "warmup": 200})
    if "error" in r:
        print(r["error"], r.get("stderr", ""), file=sys.stderr)
        return 1
    blocks = r["blocks"]
    p50 = {s: percentile([x for c in b for x in c], 50) * 1e6 for s, b in blocks.items()}
    for s, b in blocks.items():
        print(f"{s:8s} p50 {p50[s]:8.1f} µs  p99 {percentile([x for c in b for x in c], 99) * 1e6:8.1f} µs")
    sky_blocks = [percentile(b, 50) for b in blocks["skyward"]]
    fastest = min(percentile(b, 50) for b in blocks["floor"])
    print(f"Skyward ÷ floor (p50): {p50['skyward'] / p50['floor']:.2f}×;  median block ÷ the floor's fastest "
          f"block ({fastest * 1e6:.1f} µs): {percentile(sky_blocks, 50) / fastest:.2f}×  (target ≤ 3×)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
