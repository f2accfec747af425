"""Named clusters: attaching to one against starting a pool, and ``skyward exec`` against ``ssh``.

Three figures (issue 22), each from runs interleaved in one process so drift hits both sides:

* **Local**: from ``ComputePool(...)`` to the first result of a broadcast on 2 nodes, for a
  fresh unnamed pool (cold: two worker processes start) and for ``ComputePool(name=...)``
  attaching to a cluster that is up. Goal: attach <= 1 s.
* **SSH** (2 test hosts, root only): the same, the cold pool's environments already built
  (warm: what every later run of an unnamed pool pays). Goal: attach <= 1 s and <= 0.2x cold.
* **skyward exec**: the whole command (``python -m skyward.cli exec NAME task.yaml``, a run
  block of ``true`` on both hosts) against a bare ``ssh host true`` to one host, both
  verifying host keys.

::

    python bench/clusters.py           # 7 runs each; writes its section of docs/benchmarks.md
    python bench/clusters.py --quick   # 2 runs each; a smoke test, figures are noise
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from _common import loadavg, run_section  # noqa: E402

OWNER = "bench/clusters.py"
TARGET_ATTACH_S = 1.0
TARGET_SSH_RATIO = 0.2


def first_result(**pool_args: object) -> float:
    import skyward as sky

    @sky.compute
    def noop() -> int:
        return 1

    started = time.perf_counter()
    with sky.ComputePool(console=False, **pool_args) as pool:  # type: ignore[arg-type]
        noop() @ pool
        took = time.perf_counter() - started
    return took


def pair(runs: int, cold: dict, name: str) -> dict:
    """Interleaved cold starts and attaches; the cluster ``name`` is created first, ended after."""
    from skyward.clusters import manage

    first_result(name=name, **cold)  # create it (not measured)
    out: dict[str, list[float]] = {"cold": [], "attach": []}
    try:
        for _ in range(runs):
            out["cold"].append(first_result(**cold))
            out["attach"].append(first_result(name=name))
    finally:
        manage.down(name)
    return out


def exec_vs_ssh(runs: int, hosts: list, name: str) -> dict:
    from skyward.clusters import manage

    with tempfile.TemporaryDirectory() as tmp:
        task = os.path.join(tmp, "task.yaml")
        with open(task, "w") as f:
            f.write("num_nodes: 2\nrun: \"true\"\n")
        env = {**os.environ, "PYTHONPATH": ROOT}
        out: dict[str, list[float]] = {"exec": [], "ssh": []}
        try:
            for _ in range(runs):
                started = time.perf_counter()
                done = subprocess.run([sys.executable, "-m", "skyward.cli", "exec", name, task], cwd=tmp, env=env,
                                      capture_output=True, text=True)
                out["exec"].append(time.perf_counter() - started)
                if done.returncode != 0:
                    raise RuntimeError(done.stderr)
                started = time.perf_counter()
                subprocess.run(hosts[0].ssh_argv("true"), check=True, capture_output=True)
                out["ssh"].append(time.perf_counter() - started)
        finally:
            manage.down(name)
    return out


def measure(quick: bool) -> dict:
    runs = 2 if quick else 7
    home = tempfile.mkdtemp(prefix="skyb")
    os.environ["SKYWARD_HOME"] = home
    result: dict = {"runs": runs, "load_start": loadavg()}
    result["local"] = pair(runs, {"nodes": 2}, "bench-local")
    try:
        from tests.hosts import testhosts
        from tests.hosts.conftest_fixture import ssh_provider, wheelhouse
    except ImportError as exc:  # pragma: no cover - the repository's tests are not there
        result["ssh_unavailable"] = str(exc)
        return result
    reason = testhosts.unavailable_reason()
    if reason:
        result["ssh_unavailable"] = reason
        result["load_end"] = loadavg()
        return result
    with testhosts.claim_slot() as slot:
        testhosts.down(prefix=slot.prefix)
        hosts = testhosts.up(2, prefix=slot.prefix, subnet=slot.subnet)
        try:
            provider = ssh_provider(hosts, wheelhouse.__wrapped__())
            first_result(provider=provider, nodes=2)  # build the environments once (not measured)
            result["ssh"] = pair(runs, {"provider": provider, "nodes": 2}, "bench-ssh")
            first_result(name="bench-exec", provider=provider, nodes=2)
            result["exec"] = exec_vs_ssh(runs, hosts, "bench-exec")
        finally:
            testhosts.down(prefix=slot.prefix)
    result["load_end"] = loadavg()
    return result


def _med(values: list[float]) -> float:
    return statistics.median(values)


def section(r: dict, quick: bool) -> str:
    local = r["local"]
    lines = [
        "## Named clusters: attaching against starting, `skyward exec` against `ssh`",
        "",
        f"*Generated by `python bench/clusters.py{' --quick' if quick else ''}` on "
        f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')}; load average {r['load_start'][0]:.2f} at the start, "
        f"{r['load_end'][0]:.2f} at the end; medians of {r['runs']} interleaved runs. "
        "Re-running it rewrites this section only.*",
        "",
        "From `ComputePool(...)` to the first result of a broadcast on 2 nodes: a fresh unnamed pool "
        "(its environments already built, on SSH) against `ComputePool(name=...)` attaching to a cluster "
        "that is up (the same worker processes, through a bridge to each worker's socket).",
        "",
        "| where | cold pool s | attach s | attach / cold |",
        "| --- | --- | --- | --- |",
        f"| Local, 2 nodes | {_med(local['cold']):.3f} | {_med(local['attach']):.3f} | "
        f"{_med(local['attach']) / _med(local['cold']):.2f}× |",
    ]
    verdicts = [_med(local["attach"]) <= TARGET_ATTACH_S]
    if "ssh" in r:
        ssh = r["ssh"]
        ratio = _med(ssh["attach"]) / _med(ssh["cold"])
        lines.append(f"| SSH, 2 test hosts | {_med(ssh['cold']):.3f} | {_med(ssh['attach']):.3f} | {ratio:.2f}× |")
        verdicts += [_med(ssh["attach"]) <= TARGET_ATTACH_S, ratio <= TARGET_SSH_RATIO]
        ex = r["exec"]
        lines += [
            "",
            "| command | s | vs `ssh host true` |",
            "| --- | --- | --- |",
            f"| `ssh host true` (one host) | {_med(ex['ssh']):.3f} | 1.00× |",
            f"| `skyward exec NAME task.yaml` (2 hosts, run: true) | {_med(ex['exec']):.3f} | "
            f"{_med(ex['exec']) / _med(ex['ssh']):.2f}× |",
        ]
    else:
        lines += ["", f"SSH not measured: {r.get('ssh_unavailable')}."]
    ok = "PASS" if all(verdicts) else "MISS"
    lines += ["", f"**Targets: attach ≤ {TARGET_ATTACH_S:g} s on Local and SSH, and ≤ {TARGET_SSH_RATIO}× the "
                  f"cold start on SSH.** {ok}."]
    return "\n".join(lines)


if __name__ == "__main__":
    run_section(OWNER, __doc__, "clusters", measure, section)
