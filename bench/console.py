"""Does the console keep up? Task output through the live view, against plain output.

    python bench/console.py            # 8 tasks x 2,500 lines, 5 repetitions; writes its section
                                       # of docs/benchmarks.md (kept when bench/run.py rewrites it)
    python bench/console.py --quick    # 8 tasks x 250 lines, once; prints the figures only

Each repetition runs a fresh client process with a 2-node Local pool and one job: ``gather`` of
8 tasks, each printing its lines as fast as it can. The client runs in three ways, interleaved:

- ``live``: its stdout and stderr are a pseudo-terminal (120 x 40), so the console draws the live
  view, as on a user's terminal; this process reads the terminal and throws the bytes away.
- ``plain``: stdout and stderr are pipes (as in CI or ``> log``): plain lines.
- ``none``: ``console=False``: the output is not shown at all (the floor).

Reported per mode: the job's time (from sending the tasks until every result is back), the
lines per second that makes, and the time until the pool is closed (the console has printed
every line by then). The target: at least 10,000 lines/s through the live view, with the job
taking as long as with plain output.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pty
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from _common import write_section  # noqa: E402

OWNER = "bench/console.py"
MODES = ("live", "plain", "none")
TARGET_LINES_PER_S = 10_000


# -- the client, in its own process -------------------------------------------------------------------
def client(mode: str, tasks: int, lines: int, result_path: str) -> None:
    sys.path.insert(0, ROOT)
    import skyward as sky

    @sky.compute
    def spam(task: int, n: int) -> int:
        pad = "x" * 40
        for k in range(n):
            print(f"task {task} line {k} {pad}")
        return n

    with sky.ComputePool(nodes=2, console=mode != "none") as pool:
        spam(0, 1) @ pool  # warm: the function is on both workers
        started = time.perf_counter()
        counts = sky.gather(*(spam(t, lines) for t in range(tasks))) >> pool
        job = time.perf_counter() - started
    closed = time.perf_counter() - started
    assert sum(counts) == tasks * lines
    with open(result_path, "w") as f:
        json.dump({"job_s": job, "closed_s": closed}, f)


# -- the driver ---------------------------------------------------------------------------------------
def _drain(fd: int) -> None:
    while True:
        try:
            if not os.read(fd, 1 << 16):
                return
        except OSError:  # EIO: the terminal's other end is closed
            return


def run_once(mode: str, tasks: int, lines: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "result.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--client", mode, str(tasks), str(lines), result]
        env = {k: v for k, v in os.environ.items() if k not in ("SKYWARD_CONSOLE", "SKYWARD_CONSOLE_VERBOSE")}
        env["PYTHONPATH"] = os.pathsep.join([ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])
        if mode == "live":
            master, slave = pty.openpty()
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
            env["TERM"] = "xterm-256color"
            proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
            os.close(slave)
            reader = threading.Thread(target=_drain, args=(master,), daemon=True)
            reader.start()
            code = proc.wait(timeout=600)
            reader.join(5)
            os.close(master)
        else:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
            assert proc.stdout is not None
            _drain(proc.stdout.fileno())
            code = proc.wait(timeout=600)
        if code != 0 or not os.path.exists(result):
            raise SystemExit(f"bench/console.py: the {mode} client failed (exit {code})")
        with open(result) as f:
            return json.load(f)


def measure(tasks: int, lines: int, reps: int) -> dict[str, list[dict[str, float]]]:
    samples: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    for rep in range(reps):
        order = MODES if rep % 2 == 0 else tuple(reversed(MODES))  # interleaved: A B C, C B A, ...
        for mode in order:
            samples[mode].append(run_once(mode, tasks, lines))
            print(f"[console bench] rep {rep + 1}/{reps} {mode}: job {samples[mode][-1]['job_s']:.3f}s",
                  file=sys.stderr, flush=True)
    return samples


def report(samples: dict[str, list[dict[str, float]]], tasks: int, lines: int, reps: int, quick: bool) -> str:
    total = tasks * lines
    med = {m: statistics.median(s["job_s"] for s in samples[m]) for m in MODES}
    closed = {m: statistics.median(s["closed_s"] for s in samples[m]) for m in MODES}
    ratio = statistics.median(a["job_s"] / b["job_s"] for a, b in zip(samples["live"], samples["plain"]))
    rate = total / med["live"]
    load = os.getloadavg()
    rows = [
        f"| {m} | {med[m]:.3f} | {total / med[m]:,.0f} | {closed[m]:.3f} |" for m in MODES
    ]
    verdict = "PASS" if rate >= TARGET_LINES_PER_S and ratio <= 1.15 else "MISS"
    return "\n".join([
        "## Console: output through the live view",
        "",
        f"*Generated by `python bench/console.py{' --quick' if quick else ''}` on "
        f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')}; load average {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} "
        "at the end. Re-running it rewrites this section only.*",
        "",
        f"One job on a 2-node Local pool: `gather` of {tasks} tasks printing {lines:,} lines each "
        f"({total:,} lines, 60 bytes each). The client's terminal is a pseudo-terminal (120 x 40) for "
        "`live`, pipes for `plain`, and `none` is `console=False` (output not shown). Medians of "
        f"{reps} repetition{'s' if reps != 1 else ''}, modes interleaved. *closed* is the time until the "
        "pool is closed, by which point the console has printed every line.",
        "",
        "| console | job s | lines/s | closed s |",
        "| --- | --- | --- | --- |",
        *rows,
        "",
        f"**Target: ≥ {TARGET_LINES_PER_S:,} lines/s through the live view, with the job as long as with plain "
        f"output.** Measured: {rate:,.0f} lines/s; live ÷ plain job time {ratio:.2f} (median of the paired "
        f"repetitions): **{verdict}**.",
        "",
        "Before the batched view (each line printed on its own, redrawing the table each time) the same "
        "machine showed about 160 lines/s: 8 tasks of 500 lines took 24.5 s live against 0.49 s plain.",
    ])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        mode, tasks, lines, result = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
        client(mode, tasks, lines, result)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="8 x 250 lines, once; print, do not write the page")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--lines", type=int, default=None, help="lines per task (default 2,500; --quick: 250)")
    parser.add_argument("--reps", type=int, default=None, help="repetitions (default 5; --quick: 1)")
    args = parser.parse_args()
    lines = args.lines or (250 if args.quick else 2_500)
    reps = args.reps or (1 if args.quick else 5)
    section = report(measure(args.tasks, lines, reps), args.tasks, lines, reps, args.quick)
    print(section)
    if not args.quick:
        write_section(OWNER, section)


if __name__ == "__main__":
    main()
