"""Elastic pools: how long a lost node takes to be replaced, and what autoscaling saves.

Two figures (issue 24), each side measured in the same process, one after the other:

* **Replacement** (Local, and SSH on 2 test hosts when this machine can make them): on a
  ``nodes=(2, 2)`` pool, from node 1's worker SIGKILLed to a broadcast answered by both
  nodes again (the replacement prepared, started and running tasks); against the same
  provider's cold start of a 2-node pool to its first broadcast result.
* **Bursty map** (Local): a burst of short tasks, a lull, a second burst, on
  ``nodes=(1, 4)`` against a fixed 4-node pool: total time (pool start to pool end) and
  node-seconds held (the integral of the pool's size over that time, from its events).

::

    python bench/elastic.py           # writes its section of docs/benchmarks.md
    python bench/elastic.py --quick   # fewer runs; a smoke test, figures are noise
"""

from __future__ import annotations

import os
import signal
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from _common import loadavg, run_section  # noqa: E402

OWNER = "bench/elastic.py"
BURST, TASK_S, LULL_S = 32, 0.5, 10.0
SCALE_UP_AFTER, SCALE_DOWN_AFTER = 1.0, 3.0


def _tasks():
    import skyward as sky

    @sky.compute
    def where() -> tuple[int, int]:
        return sky.instance_info().node, os.getpid()

    @sky.compute
    def short(i: int) -> int:
        time.sleep(TASK_S)
        return i

    return where, short


def cold_start(**pool_args: object) -> float:
    import skyward as sky

    where, _ = _tasks()
    started = time.perf_counter()
    with sky.ComputePool(nodes=2, console=False, **pool_args) as pool:  # type: ignore[arg-type]
        where() @ pool
        return time.perf_counter() - started


def replacements(runs: int, **pool_args: object) -> list[float]:
    """Seconds from node 1's worker killed to both nodes answering a broadcast again."""
    import skyward as sky

    where, _ = _tasks()
    out = []
    with sky.ComputePool(nodes=(2, 2), console=False, idle_timeout=5, **pool_args) as pool:  # type: ignore[arg-type]
        for _ in range(runs):
            pid = dict(where() @ pool)[1]
            started = time.perf_counter()
            os.kill(pid, signal.SIGKILL)
            while True:  # (the loss is noticed on the worker's stream: wait until it is)
                try:
                    pool.wait_ready(timeout=120)
                    answered = where() @ pool
                except sky.WorkerLost:
                    continue
                if dict(answered)[1] != pid:
                    break
            out.append(time.perf_counter() - started)
    return out


def bursty(elastic: bool) -> dict:
    """Two bursts with a lull between: total seconds (pool start to end) and node-seconds
    held (the pool's size integrated over that time: its start nodes from the start, then
    each NodeAdded and NodeRemoved)."""
    import skyward as sky
    from skyward import events as ev

    _, short = _tasks()
    size = [1 if elastic else 4]
    started = time.perf_counter()
    changes: list[tuple[float, int]] = [(started, size[0])]

    def note(event: ev.Event) -> None:
        if isinstance(event, (ev.NodeAdded, ev.NodeRemoved)):
            size[0] += 1 if isinstance(event, ev.NodeAdded) else -1
            changes.append((time.perf_counter(), size[0]))

    nodes = (1, 4) if elastic else 4
    with sky.ComputePool(nodes=nodes, console=False, on_event=note, scale_up_after=SCALE_UP_AFTER,  # type: ignore[arg-type]
                         scale_down_after=SCALE_DOWN_AFTER) as pool:
        pool.map(short, range(BURST))
        time.sleep(LULL_S)
        pool.map(short, range(BURST))
    ended = time.perf_counter()
    points = changes + [(ended, 0)]
    held = sum(n * (t1 - t0) for (t0, n), (t1, _) in zip(points, points[1:]))
    return {"total": ended - started, "node_seconds": held, "max_nodes": max(n for _, n in changes)}


def measure(quick: bool) -> dict:
    runs = 2 if quick else 5
    result: dict = {"runs": runs, "load_start": loadavg()}
    result["local"] = {"cold": [cold_start() for _ in range(runs)], "replace": replacements(runs)}
    result["bursty"] = {"fixed": [bursty(False) for _ in range(1 if quick else 2)],
                        "elastic": [bursty(True) for _ in range(1 if quick else 2)]}
    try:
        from tests.hosts import testhosts
        from tests.hosts.conftest_fixture import ssh_provider, wheelhouse
    except ImportError as exc:  # pragma: no cover - the repository's tests are not there
        result["ssh_unavailable"] = str(exc)
    else:
        reason = testhosts.unavailable_reason()
        if reason:
            result["ssh_unavailable"] = reason
        else:
            with testhosts.claim_slot() as slot:
                testhosts.down(prefix=slot.prefix)
                hosts = testhosts.up(2, prefix=slot.prefix, subnet=slot.subnet)
                try:
                    provider = ssh_provider(hosts, wheelhouse.__wrapped__())
                    cold_start(provider=provider)  # build the environments once (not measured)
                    result["ssh"] = {"cold": [cold_start(provider=provider) for _ in range(runs)],
                                     "replace": replacements(runs, provider=provider)}
                finally:
                    testhosts.down(prefix=slot.prefix)
    result["load_end"] = loadavg()
    return result


def _med(values: list[float]) -> float:
    return statistics.median(values)


def section(r: dict, quick: bool) -> str:
    lines = [
        "## Elastic pools",
        "",
        f"*Generated by `python bench/elastic.py{' --quick' if quick else ''}` on "
        f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')}; load average {r['load_start'][0]:.2f} at the start, "
        f"{r['load_end'][0]:.2f} at the end; medians of {r['runs']} runs. Re-running it rewrites this "
        "section only.*",
        "",
        "From a node's worker SIGKILLed to its replacement answering a broadcast (`nodes=(2, 2)`, "
        "`replace_lost` on), against the same provider's cold start of a 2-node pool to its first "
        "broadcast result.",
        "",
        "| where | cold start s | loss to replacement running s | replacement / cold start |",
        "| --- | --- | --- | --- |",
    ]
    for key, label in (("local", "Local"), ("ssh", "SSH, 2 test hosts")):
        if key in r:
            cold, rep = _med(r[key]["cold"]), _med(r[key]["replace"])
            lines.append(f"| {label} | {cold:.3f} | {rep:.3f} | {rep / cold:.2f}× |")
    if "ssh" not in r:
        lines += ["", f"SSH not measured: {r.get('ssh_unavailable')}."]
    fixed, elastic = r["bursty"]["fixed"], r["bursty"]["elastic"]
    ft, et = _med([x["total"] for x in fixed]), _med([x["total"] for x in elastic])
    fn, en = _med([x["node_seconds"] for x in fixed]), _med([x["node_seconds"] for x in elastic])
    lines += [
        "",
        f"A bursty map on Local: {BURST} tasks of {TASK_S:g} s, a lull of {LULL_S:g} s, {BURST} more "
        f"(`scale_up_after={SCALE_UP_AFTER:g}`, `scale_down_after={SCALE_DOWN_AFTER:g}`); total time from "
        "`ComputePool(...)` to the end of the block, and node-seconds held (the pool's size over that time).",
        "",
        "| pool | total s | node-seconds | most nodes |",
        "| --- | --- | --- | --- |",
        f"| fixed, `nodes=4` | {ft:.2f} | {fn:.1f} | {max(x['max_nodes'] for x in fixed)} |",
        f"| elastic, `nodes=(1, 4)` | {et:.2f} ({et / ft:.2f}×) | {en:.1f} ({en / fn:.2f}×) | "
        f"{max(x['max_nodes'] for x in elastic)} |",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    run_section(OWNER, __doc__, "elastic", measure, section)
