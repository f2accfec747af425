"""``skyward launch`` against plain ``torchrun`` on the same nodes: examples/mingpt's training.

Two figures (issue 14):

* **steps/s ratio**: the same minGPT DDP training (2 nodes x 1 process, gloo on CPU) started by
  ``skyward launch examples/mingpt/train.yaml`` and by two ``torchrun`` processes started by
  hand with the same arguments (``--node_rank`` 0 and 1). Rank 0 reports steps/s over the steps
  after the warm-up; the goal is launch/torchrun >= 0.98 (the launcher must add nothing to the
  training loop: it only starts the command and relays its lines).
* **time to first step**: from starting ``skyward launch`` (the command, on the Local provider,
  whose environment needs no building: a warm pool) to rank 0's first optimizer step, and the
  same for the hand-started torchrun, so the difference is what the launcher costs.

Runs alternate (launch, torchrun, launch, ...) so that drift on a shared machine hits both.

::

    python bench/launch_vs_torchrun.py            # 300 steps, 5 runs each; writes bench/results/launch_vs_torchrun.json
    python bench/launch_vs_torchrun.py --quick    # 30 steps, 1 run each; a smoke test, figures are noise
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from _common import machine

EXAMPLE = ROOT / "examples" / "mingpt"
STEPS_RE = re.compile(r"mingpt: steps/s=([0-9.]+)")
FIRST_RE = re.compile(r"mingpt: first step at ([0-9.]+)")
DONE = "weights identical on every rank"


def _env(steps: int) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "MINGPT_STEPS": str(steps)}


def _parse(text: str, started: float, what: str) -> dict[str, float]:
    steps, first = STEPS_RE.search(text), FIRST_RE.search(text)
    if not steps or not first or DONE not in text:
        raise SystemExit(f"{what}: the training did not report (last output):\n{text[-3000:]}")
    return {"steps_per_s": float(steps.group(1)), "first_step_s": float(first.group(1)) - started}


def run_launch(steps: int, timeout: float) -> dict[str, float]:
    started = time.time()
    done = subprocess.run(
        [sys.executable, "-m", "skyward.cli", "launch", str(EXAMPLE / "train.yaml"), "--env", f"MINGPT_STEPS={steps}"],
        cwd=ROOT, env=_env(steps), capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise SystemExit(f"skyward launch failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return _parse(done.stdout, started, "skyward launch")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_torchrun(steps: int, timeout: float) -> dict[str, float]:
    """The seed's torchrun command, started by hand on each of the 2 'nodes' (this machine)."""
    port = _free_port()
    env = {**_env(steps), "SKYPILOT_NUM_NODES": "2"}
    started = time.time()
    procs = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
         "--master_addr=127.0.0.1", f"--master_port={port}", f"--node_rank={rank}", "main.py"],
        cwd=EXAMPLE, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
    outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    if any(p.returncode != 0 for p in procs):
        raise SystemExit("torchrun failed:\n" + "\n".join(o[-2000:] for o in outputs))
    return _parse(outputs[0], started, "torchrun")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="30 steps, 1 run each (a smoke test)")
    parser.add_argument("--runs", type=int, help="runs of each (default 5; 1 with --quick)")
    parser.add_argument("--steps", type=int, help="training steps per run (default 300; 30 with --quick)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "launch_vs_torchrun.json"))
    args = parser.parse_args()
    runs = args.runs or (1 if args.quick else 5)
    steps = args.steps or (30 if args.quick else 300)
    timeout = 120 + steps * 2.0
    results: dict[str, list[dict[str, float]]] = {"launch": [], "torchrun": []}
    for i in range(runs):
        for name, run in (("launch", run_launch), ("torchrun", run_torchrun)):
            r = run(steps, timeout)
            results[name].append(r)
            print(f"run {i + 1}/{runs} {name:8s} steps/s={r['steps_per_s']:.2f} "
                  f"first step after {r['first_step_s']:.2f}s", flush=True)

    def median(name: str, field: str) -> float:
        return statistics.median(r[field] for r in results[name])

    ratio = median("launch", "steps_per_s") / median("torchrun", "steps_per_s")
    summary = {
        "steps_per_s": {n: median(n, "steps_per_s") for n in results},
        "ratio_launch_over_torchrun": ratio,
        "goal_ratio": 0.98,
        "first_step_s": {n: median(n, "first_step_s") for n in results},
        "launch_overhead_to_first_step_s": median("launch", "first_step_s") - median("torchrun", "first_step_s"),
    }
    print(json.dumps(summary, indent=2))
    if args.quick:
        print("--quick: figures are noise; nothing written", flush=True)
        return 0
    record = {"command": "python bench/launch_vs_torchrun.py" + (f" --runs {runs}" if args.runs else "")
              + (f" --steps {steps}" if args.steps else ""),
              "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine(), "nodes": 2,
              "processes_per_node": 1, "steps": steps, "runs": runs, "summary": summary, "raw": results}
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
