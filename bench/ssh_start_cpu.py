"""Where the CPU of an SSH pool's start goes, by kind of process, per host.

    python bench/ssh_start_cpu.py --hosts 8              # this checkout, 3 starts of 8 test hosts
    python bench/ssh_start_cpu.py --hosts 16 --against /work/main --reps 2
                                                          # and another checkout's, interleaved

Each measured start is a fresh client process: it imports skyward, starts ``perf record -a``
(every CPU of the machine, 999 samples a second), opens ``ComputePool(nodes=N)`` on N SSH test
hosts (``tests/hosts/testhosts.py``, one node per host, an image the hosts built before: a warm
start) and stops perf as soon as every worker has said READY. The samples are summed by
process: the client itself, the workers (``python -m skyward.worker`` processes), and every
other process by its command name (sshd, sh, bash, cat, sftp-server...). Printed: milliseconds
of CPU per host by kind, and the start's wall time. The machine's other work shows too (under
its own names): run it on a quiet machine and read ``cat /proc/loadavg``. Needs root and perf.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from _common import hosts_wheelhouse, loadavg  # noqa: E402

HZ = 999


def command_lines() -> dict[int, str]:
    """Every process of this machine (the test hosts' too): its command line."""
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    found[int(name)] = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                pass
    return found


def client(nodes: int, ssh: dict[str, Any], result_path: str, root: str) -> None:
    sys.path.insert(0, root)
    import skyward as sky

    hosts = ssh["hosts"][:nodes]
    provider = sky.SSH([h["ip"] for h in hosts], user=hosts[0]["user"], key=hosts[0]["key_path"],
                       known_hosts=hosts[0]["known_hosts_all"], find_links=[ssh["wheelhouse"]], no_index=True,
                       connect_timeout=10)
    image = sky.Image(env={"BENCH_IMAGE": ssh["image_tag"]})
    if not ssh.get("perf"):
        with sky.ComputePool(nodes=nodes, console=False, start_timeout=600, provider=provider, image=image):
            return
    data = result_path + ".perf"
    perf = subprocess.Popen(["perf", "record", "-a", "-F", str(HZ), "-o", data, "-q"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)  # perf is recording (its own start is not measured)
    started = time.perf_counter()
    pool = sky.ComputePool(nodes=nodes, console=False, start_timeout=600, provider=provider, image=image).__enter__()
    try:
        wall = time.perf_counter() - started
        perf.send_signal(signal.SIGINT)
        alive = command_lines()
        perf.wait()
    finally:
        pool.__exit__(None, None, None)
    script = subprocess.run(["perf", "script", "-i", data, "-F", "comm,pid"], capture_output=True, text=True)
    os.unlink(data)
    cpu: collections.Counter[str] = collections.Counter()
    for line in script.stdout.splitlines():
        comm, _, pid = line.strip().rpartition(" ")
        comm = comm.strip()
        if not pid.isdigit() or comm in ("swapper", "perf"):
            continue
        pid_ = int(pid)
        line_ = alive.get(pid_, "")
        kind = ("client" if pid_ == os.getpid() else "worker" if "skyward.worker" in line_
                else f"{comm} ({line_[:60]})" if line_ and comm.startswith("python") else comm)
        cpu[kind] += 1000.0 / HZ
    with open(result_path, "w") as f:
        json.dump({"wall": wall, "cpu_ms": dict(cpu)}, f)


def run_once(nodes: int, ssh: dict[str, Any], root: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "result.json")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])]))
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--client", str(nodes), json.dumps(ssh),
                               result, root], env=env, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise SystemExit(f"the {nodes}-host client failed:\n" + (done.stdout + done.stderr)[-3000:])
        if not os.path.exists(result):
            return {}
        with open(result) as f:
            return json.load(f)


def show(name: str, nodes: int, samples: list[dict[str, Any]]) -> None:
    kinds = sorted({k for s in samples for k in s["cpu_ms"]},
                   key=lambda k: -statistics.median(s["cpu_ms"].get(k, 0.0) for s in samples))
    total = statistics.median(sum(s["cpu_ms"].values()) for s in samples) / nodes
    wall = statistics.median(s["wall"] for s in samples)
    print(f"\n{name}: {nodes} hosts, start {wall:.2f} s (median of {len(samples)}), "
          f"CPU per host {total:.0f} ms")
    for kind in kinds:
        per_host = statistics.median(s["cpu_ms"].get(kind, 0.0) for s in samples) / nodes
        if per_host >= 0.5:
            print(f"  {kind:16s} {per_host:6.1f} ms/host")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        client(int(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4], sys.argv[5])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--against", default=None, help="another checkout, measured interleaved")
    args = parser.parse_args()
    sys.path.insert(0, ROOT)
    from tests.hosts import testhosts

    roots = [ROOT] + ([os.path.abspath(args.against)] if args.against else [])
    wheelhouse = hosts_wheelhouse()
    print(f"load average at the start: {loadavg()}")
    samples: list[list[dict[str, Any]]] = [[] for _ in roots]
    with testhosts.claim_slot(prefix="skyp") as slot:
        testhosts.down(prefix=slot.prefix)
        try:
            hosts = testhosts.up(args.hosts, prefix=slot.prefix, subnet=slot.subnet)
            ssh = {"hosts": [{"ip": h.ip, "user": h.user, "key_path": h.key_path,
                              "known_hosts_all": h.known_hosts_all} for h in hosts],
                   "wheelhouse": wheelhouse, "image_tag": f"cpu-{uuid.uuid4().hex}"}
            for k, root in enumerate(roots):  # builds each checkout's image once: measured starts are warm
                run_once(args.hosts, dict(ssh, image_tag=f"{ssh['image_tag']}-{k}"), root)
            for rep in range(args.reps):
                for k in range(len(roots)) if rep % 2 == 0 else reversed(range(len(roots))):
                    samples[k].append(run_once(args.hosts, dict(ssh, image_tag=f"{ssh['image_tag']}-{k}", perf=True),
                                               roots[k]))
        finally:
            testhosts.down(prefix=slot.prefix)
    for root, got in zip(roots, samples):
        show(root, args.hosts, got)
    print(f"\nload average at the end: {loadavg()}")


if __name__ == "__main__":
    main()
