"""``skyward dashboard`` following a job that prints 10,000 lines a second.

A Local cluster of 2 nodes runs a job whose every node prints 10,000 lines a second; a real
``skyward dashboard`` server (its own process) is asked for the job's log as the job page asks:
once a second, with the byte offsets the last answer gave. Measured while it prints: each
poll's time, the lines it brought, and the server's CPU (its process's user + system time over
the wall time). Then the job is cancelled and its log, by then hundreds of thousands of lines,
is asked with nothing new: by offset (what the page does) against reading the whole log (what
``skyward logs --no-follow`` does, and the page did before).

::

    python bench/dashboard.py           # 30 s of printing; writes its section of docs/benchmarks.md
    python bench/dashboard.py --quick   # 5 s; a smoke test, figures are noise
"""

from __future__ import annotations

import io
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from _common import (Dashboard, bench_home, chatty_job, cluster, cpu_seconds, generated, loadavg,  # noqa: E402
                     percentile, run_section, sky)

OWNER = "bench/dashboard.py"
NODES = 2
LINES_PER_SECOND = 10_000  # (per node)


def measure(quick: bool) -> dict:
    seconds = 5 if quick else 30
    result: dict = {"nodes": NODES, "seconds": seconds, "load_start": loadavg()}
    with bench_home("skybd") as work:
        with open(os.path.join(work, "job.yaml"), "w") as f:
            f.write(chatty_job(NODES, NODES * LINES_PER_SECOND, every=0.01))
        with cluster("bench-dash", work, "-d", "job.yaml"), Dashboard(work) as server:
            follow(server, seconds, result)
            cancelled = sky("cancel", "bench-dash", "1", cwd=work)
            if cancelled.returncode != 0:
                raise RuntimeError(cancelled.stderr)
            read_back(quick, result)
    result["load_end"] = loadavg()
    return result


def follow(server: Dashboard, seconds: float, result: dict) -> None:
    """Ask for the job's log as its page does, once a second, for ``seconds``."""
    path = "/api/clusters/bench-dash/jobs/1/log"
    seen: dict[str, int] = {}
    polls, lines = [], 0
    cpu0, wall0 = cpu_seconds(server.pid), time.monotonic()
    while time.monotonic() - wall0 < seconds:
        asked = time.monotonic()
        answer = server.get(path + "?seen=" + ",".join(f"{n}:{c}" for n, c in seen.items()))
        polls.append(time.monotonic() - asked)
        lines += len(answer["lines"])
        seen = answer["seen"]
        time.sleep(max(0.0, 1.0 - (time.monotonic() - asked)))  # (the page asks once a second)
    wall, cpu1 = time.monotonic() - wall0, cpu_seconds(server.pid)
    result.update(polls=polls, lines=lines, wall=wall, server_cpu=cpu1[0] - cpu0[0], children_cpu=cpu1[1] - cpu0[1],
                  seen=seen)


def read_back(quick: bool, result: dict) -> None:
    """The cancelled job's whole log, nothing new: read from the page's offsets, and whole."""
    from skyward.clusters import jobs

    caught = {int(n): c for n, c in result.pop("seen").items()}
    while True:  # (to the end of the log: what is left after the polls, and what the cancel let through)
        parts = jobs.log_since("bench-dash", 1, caught)
        if not any(lines for lines, _, _ in parts.values()):
            break
        caught = {n: end for n, (_, end, _) in parts.items()}
    result["log_bytes"] = sum(caught.values())
    by_offset, whole = [], []
    for _ in range(3 if quick else 7):
        started = time.perf_counter()
        jobs.log_since("bench-dash", 1, caught)
        by_offset.append(time.perf_counter() - started)
        started = time.perf_counter()
        jobs.logs("bench-dash", 1, io.StringIO(), follow=False)
        whole.append(time.perf_counter() - started)
    result.update(by_offset=by_offset, whole=whole)


def section(r: dict, quick: bool) -> str:
    polls = r["polls"]
    printed = r["nodes"] * LINES_PER_SECOND
    return "\n".join([
        "## Dashboard: following a job that prints 10,000 lines a second",
        "",
        generated(OWNER, quick, r),
        "",
        f"A Local cluster of {r['nodes']} nodes; every node prints {LINES_PER_SECOND:,} lines a second "
        f"({printed:,} in all); a `skyward dashboard` server is asked for the job's log once a second, "
        f"as the job page asks, for {r['seconds']} s.",
        "",
        "| figure | value |",
        "| --- | --- |",
        f"| polls | {len(polls)} |",
        f"| poll time, median / p90 / max | {statistics.median(polls):.2f} s / {percentile(polls, 90):.2f} s / "
        f"{max(polls):.2f} s |",
        f"| lines brought per second (printed: {printed:,}; the first poll also brings what was printed "
        f"before it) | {r['lines'] / r['wall']:,.0f} |",
        f"| server CPU (user + system / wall) | {100 * r['server_cpu'] / r['wall']:.0f} % of one core |",
        f"| the node-side reads it ran (on Local, its child processes) | "
        f"{100 * r['children_cpu'] / r['wall']:.0f} % of one core |",
        f"| then, the job's log ({r['log_bytes'] / 1e6:.0f} MB), nothing new: read from the page's offsets | "
        f"{statistics.median(r['by_offset']):.2f} s |",
        f"| the same log read whole (`skyward logs --no-follow`; the page before offsets) | "
        f"{statistics.median(r['whole']):.2f} s |",
        "",
        "A poll brings at most 1 MB per node (the rest with the next), so a poll's time is bounded by",
        "what is new, not by the log's size. 128 nodes and the browser's time to first paint:",
        "`bench/dashboard_wide.py`, below.",
    ])


if __name__ == "__main__":
    run_section(OWNER, __doc__, "dashboard", measure, section)
