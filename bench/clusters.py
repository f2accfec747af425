"""Named clusters: attaching to one against starting a pool, and ``skyward exec`` against ``ssh``.

Three figures (issue 22), each from runs interleaved in one process so drift hits both sides:

* **Local**: from ``ComputePool(...)`` to the first result of a broadcast on 2 nodes, for a
  fresh unnamed pool (cold: two worker processes start) and for ``ComputePool(name=...)``
  attaching to a cluster that is up. Goal: attach <= 1 s.
* **SSH** (2 test hosts, root only): the same, the cold pool's environments already built
  (warm: what every later run of an unnamed pool pays). Goal: attach <= 1 s and <= 0.2x cold.
* **skyward exec**: the whole command, as a task file (``python -m skyward.cli exec NAME
  task.yaml``, a run block of ``true`` on both hosts) and as a command (``skyward exec NAME
  --num-nodes 2 true``), against OpenSSH's ``ssh host true`` to one host and a raw paramiko
  connect + exec of ``true`` to one host (a fresh interpreter, as the command is), all verifying
  host keys. Every interpreter here runs with its bytecode cache (as an installed package does:
  ``PYTHONDONTWRITEBYTECODE`` is dropped and each is run once before the runs that count).
  Goals (issue 35): attach on SSH <= 0.3 s; ``skyward exec NAME 'cmd'`` <= 2x ``ssh host true``.

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
TARGET_SSH_ATTACH_S = 0.3  # issue 35
TARGET_EXEC_VS_SSH = 2.0  # issue 35: `skyward exec NAME 'cmd'` against `ssh host true`
#: A raw paramiko client's connect + exec of ``true`` (argv: host, port, user, key, known_hosts).
RAW_PARAMIKO = """
import sys, paramiko
host, port, user, key, known = sys.argv[1:]
client = paramiko.SSHClient()
client.load_system_host_keys(known)
client.set_missing_host_key_policy(paramiko.RejectPolicy())
client.connect(host, port=int(port), username=user, key_filename=key, allow_agent=False, look_for_keys=False)
_, out, _ = client.exec_command("true")
sys.exit(out.channel.recv_exit_status())
"""


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
    """Interleaved runs of each command (the first of each not counted: it writes the caches)."""
    from skyward.clusters import manage

    with tempfile.TemporaryDirectory() as tmp:
        task = os.path.join(tmp, "task.yaml")
        with open(task, "w") as f:
            f.write("num_nodes: 2\nrun: \"true\"\n")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPATH"] = ROOT
        h = hosts[0]
        commands = {
            "exec": [sys.executable, "-m", "skyward.cli", "exec", name, task],
            "exec_cmd": [sys.executable, "-m", "skyward.cli", "exec", name, "--num-nodes", "2", "true"],
            "ssh": h.ssh_argv("true"),
            "paramiko": [sys.executable, "-c", RAW_PARAMIKO, h.ip, str(h.port), h.user, h.key_path, h.known_hosts],
        }
        out: dict[str, list[float]] = {key: [] for key in commands}
        try:
            for counted in [False] + [True] * runs:
                for key, argv in commands.items():
                    started = time.perf_counter()
                    done = subprocess.run(argv, cwd=tmp, env=env, capture_output=True, text=True)
                    if counted:
                        out[key].append(time.perf_counter() - started)
                    if done.returncode != 0:
                        raise RuntimeError(f"{key}: {done.stderr}")
            out["load"] = list(loadavg())
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
        ssh_s, raw_s = _med(ex["ssh"]), _med(ex["paramiko"])

        def row(what: str, key: str) -> str:
            return f"| {what} | {_med(ex[key]):.3f} | {_med(ex[key]) / ssh_s:.2f}× | {_med(ex[key]) / raw_s:.2f}× |"

        lines += [
            "",
            f"Commands, each a fresh process with its bytecode cache (load average {ex['load'][0]:.2f} after them):",
            "",
            "| command | s | vs `ssh host true` | vs raw paramiko |",
            "| --- | --- | --- | --- |",
            row("`ssh host true` (OpenSSH, one host)", "ssh"),
            row("raw paramiko: connect + exec `true` (one host)", "paramiko"),
            row("`skyward exec NAME --num-nodes 2 true` (2 hosts)", "exec_cmd"),
            row("`skyward exec NAME task.yaml` (2 hosts, run: true)", "exec"),
        ]
        verdicts += [_med(ssh["attach"]) <= TARGET_SSH_ATTACH_S, _med(ex["exec_cmd"]) <= TARGET_EXEC_VS_SSH * ssh_s]
    else:
        lines += ["", f"SSH not measured: {r.get('ssh_unavailable')}."]
    ok = "PASS" if all(verdicts) else "MISS"
    lines += ["", f"**Targets: attach ≤ {TARGET_ATTACH_S:g} s on Local and SSH, and ≤ {TARGET_SSH_RATIO}× the "
                  f"cold start on SSH; attach ≤ {TARGET_SSH_ATTACH_S:g} s on SSH and `skyward exec NAME "
                  f"'cmd'` ≤ {TARGET_EXEC_VS_SSH:g}× `ssh host true`.** {ok}" + (
                      "" if all(verdicts) else f" ({sum(not v for v in verdicts)} of {len(verdicts)} missed)") + "."]
    return "\n".join(lines)


if __name__ == "__main__":
    run_section(OWNER, __doc__, "clusters", measure, section)
