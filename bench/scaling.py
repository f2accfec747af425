"""How a pool grows: start time, threads, client and worker memory, broadcast and gather from 2 to
1,000 nodes.

    python bench/scaling.py            # Local 2, 64, 128, 256, 512, 1000 nodes and SSH 8, 64 test hosts,
                                       # 3 repetitions; writes its section of docs/benchmarks.md
                                       # (kept when bench/run.py rewrites the page)
    python bench/scaling.py --quick    # Local 1, 4, 16 nodes, once; prints the figures only
    python bench/scaling.py --no-ssh   # Local only
    python bench/scaling.py --local-sizes 8,128,512 --no-ssh --reps 1   # chosen Local sizes
    python bench/scaling.py --local-sizes 2,64 --no-ssh --print   # prints the section, writes nothing
    python bench/scaling.py --no-local --ssh-sizes 8,64 --print   # SSH only: 8 and 64 test hosts
    python bench/scaling.py --local-sizes 2,64 --against /work/main
                                       # the same sizes with another checkout's skyward, interleaved
                                       # with this one's (ratios in the same run); prints only
    python bench/scaling.py --no-local --ssh-sizes 8,64 --against /work/main   # the same, SSH

Each measurement is a fresh client process (``--client``) that opens a pool of N nodes and reports:

- ``start``: entering ``ComputePool(nodes=N)`` until every worker has said READY;
- ``threads``: the client's threads while the pool is open, less those it had before;
- ``client_kib``: the client's resident memory while the pool is open, less what it was before,
  per node (KiB);
- ``broadcast``: the median of 20 ``noop() @ pool`` (one no-op task on every node, all answers back),
  after one to warm up;
- ``worker_kib``: the proportional set size of the workers' processes (worker, guard, keeper), per node;
- ``gather``: ``sky.gather(*no-op tasks) >> pool``, 1024 tasks or 100 per node if more (1,000 nodes:
  100,000), as tasks per second;
- ``close``: leaving the block until every worker is confirmed gone; then the client checks that it
  has no worker process left.

Sizes are interleaved (ascending, then descending, ...). The cost per added node is the slope of a
least-squares line through the medians. The SSH pools run on test hosts (``tests/hosts/testhosts.py``:
real sshds in network namespaces of this machine, so the hosts share its cores), one node per host,
with an image the hosts have built before (a warm start); needs root.
"""

from __future__ import annotations

import argparse
import json
import os
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

from _common import hosts_wheelhouse, loadavg, write_section  # noqa: E402

OWNER = "bench/scaling.py"
LOCAL_SIZES = (2, 64, 128, 256, 512, 1000)
SSH_SIZES = (8, 64)
BROADCASTS = 20
GATHERED = 1024
#: Tasks per node in the gather, past GATHERED (1,000 nodes: 100,000 tasks).
GATHERED_PER_NODE = 100
METRICS = ("start", "busy", "threads", "client_kib", "worker_kib", "broadcast", "gathered", "gather", "close")


def gathered(nodes: int) -> int:
    return max(GATHERED, GATHERED_PER_NODE * nodes)


def my_workers() -> list[int]:
    """The processes of this client's workers (guards, keepers and workers: its descendants
    whose command line runs skyward.worker)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    children.setdefault(int(f.read().rsplit(b")", 1)[1].split()[1]), []).append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    found, todo = [], [os.getpid()]
    while todo:
        for pid in children.get(todo.pop(), ()):
            todo.append(pid)
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"skyward.worker" in f.read():
                        found.append(pid)
            except OSError:
                continue
    return found


def pss_kib(pids: list[int]) -> float:
    """The proportional set size of ``pids`` together (KiB): each shared page counted once
    across the processes sharing it (Linux smaps_rollup)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
        except (OSError, StopIteration):
            continue
    return total


def busy_s() -> float:
    """CPU time this machine's cores have spent busy since boot, all processes (Linux /proc/stat):
    the difference over a start says whether that start kept the cores busy (then it was
    CPU-bound) or waited (then something in it was serial)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # less idle and iowait


def rss_kib() -> float:
    """This process's resident memory now, KiB (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1024


# -- the client, in its own process -------------------------------------------------------------------
def client(nodes: int, ssh: dict[str, Any] | None, result_path: str, root: str = ROOT) -> None:
    sys.path.insert(0, root)
    import skyward as sky

    @sky.compute
    def noop() -> None:
        return None

    kw: dict[str, Any] = {}
    if ssh is not None:
        hosts = ssh["hosts"][:nodes]
        kw["provider"] = sky.SSH([h["ip"] for h in hosts], user=hosts[0]["user"], key=hosts[0]["key_path"],
                                 known_hosts=hosts[0]["known_hosts_all"], find_links=[ssh["wheelhouse"]],
                                 no_index=True, connect_timeout=10)
        kw["image"] = sky.Image(env={"BENCH_IMAGE": ssh["image_tag"]})
    import threading

    threads, rss = threading.active_count(), rss_kib()
    busy, own, started = busy_s(), time.process_time(), time.perf_counter()
    pool = sky.ComputePool(nodes=nodes, console=False, start_timeout=600, **kw).__enter__()
    try:
        start, busy, own = time.perf_counter() - started, busy_s() - busy, time.process_time() - own
        threads, client_kib = threading.active_count() - threads, (rss_kib() - rss) / nodes
        worker_kib = pss_kib(my_workers()) / nodes if ssh is None else 0.0
        assert noop() @ pool == [None] * nodes  # warm: the function is on every worker
        trips = []
        for _ in range(BROADCASTS):
            t = time.perf_counter()
            noop() @ pool
            trips.append(time.perf_counter() - t)
        count = gathered(nodes)
        t = time.perf_counter()
        assert len(sky.gather(*(noop() for _ in range(count))) >> pool) == count
        gather = count / (time.perf_counter() - t)
    finally:
        t = time.perf_counter()
        pool.__exit__(None, None, None)
        close = time.perf_counter() - t
    left = my_workers() if ssh is None else []
    assert not left, f"{len(left)} worker processes left after the pool closed"
    with open(result_path, "w") as f:
        json.dump({"start": start, "busy": busy / (start * (os.cpu_count() or 1)),
                   "client_cpu": own / start, "threads": threads, "client_kib": client_kib, "worker_kib": worker_kib,
                   "broadcast": statistics.median(trips), "gathered": count, "gather": gather, "close": close}, f)


# -- the driver ---------------------------------------------------------------------------------------
def run_once(nodes: int, ssh: dict[str, Any] | None, root: str = ROOT) -> dict[str, float]:
    """One client process of ``nodes`` nodes, its skyward imported from ``root``."""
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "result.json")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])]))
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--client", str(nodes),
                               json.dumps(ssh), result, root], env=env, capture_output=True, text=True,
                              timeout=1800)
        if done.returncode != 0 or not os.path.exists(result):
            raise SystemExit(f"bench/scaling.py: the {nodes}-node client failed (exit {done.returncode}):\n"
                             + (done.stdout + done.stderr)[-3000:])
        with open(result) as f:
            return json.load(f)


def ssh_for(ssh: dict[str, Any] | None, k: int) -> dict[str, Any] | None:
    """The SSH settings for checkout number ``k``: an image of its own (its own environment on
    the hosts, so that checkouts taking turns never reinstall each other's skyward)."""
    return None if ssh is None else dict(ssh, image_tag=f"{ssh['image_tag']}-{k}")


def measure(sizes: tuple[int, ...], reps: int, ssh: dict[str, Any] | None,
            roots: tuple[str, ...] = (ROOT,)) -> list[dict[int, list[dict[str, float]]]]:
    """Samples per size, one dict per checkout of ``roots`` (each size run with each checkout in
    turn, the order alternating between repetitions)."""
    samples: list[dict[int, list[dict[str, float]]]] = [{n: [] for n in sizes} for _ in roots]
    for rep in range(reps):
        for n in sizes if rep % 2 == 0 else tuple(reversed(sizes)):
            for k in range(len(roots)) if rep % 2 == 0 else reversed(range(len(roots))):
                what = ("SSH" if ssh else "Local") + (f" [{roots[k]}]" if len(roots) > 1 else "")
                load = loadavg()[0]
                samples[k][n].append(dict(run_once(n, ssh_for(ssh, k), roots[k]), load=load))
                report_sample(what, rep, reps, n, samples[k][n][-1])
    return samples


def report_sample(what: str, rep: int, reps: int, n: int, s: dict[str, float]) -> None:
    print(f"[scaling] {what} rep {rep + 1}/{reps} {n:>3} nodes: start {s['start']:.2f}s (cores "
          f"{s['busy']:.0%} busy, the client's CPU {s['client_cpu']:.0%} of one core), threads "
                  f"+{s['threads']}, client {s['client_kib']:.0f} KiB/node, workers {s['worker_kib']:.0f} KiB/node, broadcast "
                  f"{s['broadcast'] * 1e3:.1f}ms, gather {s['gather']:,.0f}/s, close {s['close']:.2f}s "
                  f"(load {loadavg()[0]:.1f})", file=sys.stderr, flush=True)


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def table(samples: dict[int, list[dict[str, float]]]) -> tuple[list[str], str]:
    med = {n: {m: statistics.median(s[m] for s in runs) for m in METRICS} for n, runs in samples.items()}
    rows = [f"| {n} | {v['start']:.2f} | {v['start'] / n * 1e3:.1f} | {v['busy']:.0%} | {v['threads']:.0f} | {v['client_kib']:.0f} | "
            f"{v['worker_kib'] / 1024:.1f} | {v['broadcast'] * 1e3:.2f} | {v['gathered']:,.0f} | {v['gather']:,.0f} | "
            f"{v['gathered'] / v['gather']:.2f} | {v['close']:.2f} |"
            for n, v in med.items()]
    loads = [s["load"] for runs in samples.values() for s in runs]
    rows.append("")
    rows.append(f"1-minute load average as each measurement started: {min(loads):.1f}–{max(loads):.1f} "
                f"(median {statistics.median(loads):.1f}).")
    ns = [float(n) for n in med]
    if len(ns) < 2:
        return rows, ""
    per = {m: slope(ns, [v[m] for v in med.values()]) for m in ("start", "broadcast", "close")}
    gather_s = slope(ns, [1 / v["gather"] for v in med.values()])
    cost = (f"Cost per added node (least-squares slope over the medians): start **{per['start'] * 1e3:+.0f} ms**, "
            f"broadcast **{per['broadcast'] * 1e6:+.0f} µs**, a gathered task "
            f"**{gather_s * 1e9:+.0f} ns**, close **{per['close'] * 1e3:+.0f} ms**.")
    return rows, cost


def report(local: dict[int, list[dict[str, float]]], ssh: dict[int, list[dict[str, float]]] | str | None,
           reps: int, quick: bool, load_start: list[float], cores: int) -> str:
    head = ("| nodes | start s | start ms/node | cores busy in start | threads added | client KiB/node | worker MiB/node | broadcast ms "
            "| tasks gathered | gather tasks/s | gather s | close s |")
    rule = "|" + " --- |" * 12
    load = loadavg()
    lines = [
        "## Scaling: start, threads, client memory, broadcast and gather with the pool's size",
        "",
        f"*Generated by `python bench/scaling.py{' --quick' if quick else ''}` on "
        f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')}, {cores} cores; load average {load_start[0]:.2f}, "
        f"{load_start[1]:.2f}, {load_start[2]:.2f} at the start and {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} at "
        "the end. Re-running it rewrites this section only.*",
        "",
        f"Each figure is the median of {reps} repetition{'s' if reps != 1 else ''}, each a fresh client process "
        "opening a pool of that size (sizes interleaved). *start*: entering the pool until every worker is "
        "ready; *cores busy in start*: the CPU time all of this machine's processes used during the start "
        "(/proc/stat, other work included) over the start's length times the cores (near 100%: the start "
        "was CPU-bound, not waiting on something serial); *threads added*: the client's threads with the pool open, less before; *client KiB/node*: the "
        f"client's resident memory with the pool open, less before, per node; *worker MiB/node*: the "
        "proportional set size (shared pages divided among their sharers) of a node's worker, its guard and "
        f"keeper (Local only); *broadcast*: the median of {BROADCASTS} `noop() @ pool`, every node's answer back; "
        f"*gather*: `sky.gather(*tasks) >> pool` of no-op tasks, {GATHERED} or {GATHERED_PER_NODE} per node "
        "if more; *close*: leaving the block, every worker confirmed gone (and the client checks that it has "
        "no worker process left). Every worker is a process of this machine (Local) or of a test host sharing its cores (SSH): "
        "past a few nodes per core the figures measure the cores being shared, which is the point of the "
        "cost per node.",
        "",
        "### Local",
        "",
        head,
        rule,
    ]
    if local:
        rows, cost = table(local)
        lines += [*rows, "", cost] if cost else rows
    else:
        lines[-2:] = ["Not measured (--no-local)."]
    lines += ["", "### SSH (test hosts, warm image, one node per host)", ""]
    if isinstance(ssh, dict):
        rows, cost = table(ssh)
        lines += [head, rule, *rows] + (["", cost] if cost else [])
        lines += ["", start_ratio(ssh)]
    else:
        lines.append(f"Not measured: {ssh or 'skipped (--no-ssh or --quick)'}.")
    return "\n".join(lines)


def start_ratio(samples: dict[int, list[dict[str, float]]]) -> str:
    """The largest pool's start over the smallest's (medians), the figure of the target
    "64 hosts within 2x the time of 8"."""
    small, big = min(samples), max(samples)
    ratio = statistics.median(s["start"] for s in samples[big]) / statistics.median(s["start"] for s in samples[small])
    return f"Start of {big} hosts ÷ start of {small} hosts (medians, same run): **{ratio:.2f}×**."


def measure_ssh(sizes: tuple[int, ...], reps: int,
                roots: tuple[str, ...] = (ROOT,)) -> list[dict[int, list[dict[str, float]]]] | str:
    sys.path.insert(0, ROOT)
    try:
        from tests.hosts import testhosts
    except ImportError as exc:
        return f"tests/hosts/testhosts.py cannot be imported: {exc}"
    why = testhosts.unavailable_reason()
    if why:
        return why
    wheelhouse = hosts_wheelhouse()
    with testhosts.claim_slot(prefix="skyp") as slot:  # the slots test sessions use: no clashes
        testhosts.down(prefix=slot.prefix)
        try:
            hosts = testhosts.up(max(sizes), prefix=slot.prefix, subnet=slot.subnet)
            ssh = {"hosts": [{"ip": h.ip, "user": h.user, "key_path": h.key_path,
                              "known_hosts_all": h.known_hosts_all} for h in hosts],
                   "wheelhouse": wheelhouse, "image_tag": f"scaling-{uuid.uuid4().hex}"}
            print(f"[scaling] SSH: building the image on {max(sizes)} hosts", file=sys.stderr, flush=True)
            for k, root in enumerate(roots):  # every host builds each image once: the measured starts are warm
                run_once(max(sizes), ssh_for(ssh, k), root)
            return measure(sizes, reps, ssh, roots)
        finally:
            testhosts.down(prefix=slot.prefix)


def compare(sizes: tuple[int, ...], reps: int, against: str, ssh: bool = False) -> None:
    """This checkout against ``against``, the same sizes interleaved (Local, or with ``ssh`` SSH
    test hosts): both tables, and this one's medians over the other's."""
    load = loadavg()
    roots = (ROOT, os.path.abspath(against))
    both = measure_ssh(sizes, reps, roots) if ssh else measure(sizes, reps, None, roots)
    if isinstance(both, str):
        raise SystemExit(f"bench/scaling.py: SSH not measured: {both}")
    ours, theirs = both
    print(f"load average {load[0]:.2f} at the start, {loadavg()[0]:.2f} at the end")
    for name, samples in ((ROOT, ours), (against, theirs)):
        print(f"\n{name}:\n" + "\n".join(table(samples)[0]))
    print("\nratios (this checkout / the other, medians): ")
    for n in sizes:
        mine = {m: statistics.median(s[m] for s in ours[n]) for m in METRICS}
        other = {m: statistics.median(s[m] for s in theirs[n]) for m in METRICS}
        print(f"  {n} nodes: " + ", ".join(f"{m} {mine[m] / other[m]:.2f}x" for m in
                                            ("start", "busy", "client_kib", "worker_kib", "broadcast", "gather",
                                             "close")
                                            if other[m]))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        client(int(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4], *sys.argv[5:6])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="Local 1, 4, 16 nodes once; print, do not write")
    parser.add_argument("--no-ssh", action="store_true", help="Local only")
    parser.add_argument("--reps", type=int, default=None, help="repetitions (default 3; --quick: 1)")
    parser.add_argument("--local-sizes", default=None, help="comma-separated Local pool sizes (default "
                        + ",".join(map(str, LOCAL_SIZES)) + ")")
    parser.add_argument("--ssh-sizes", default=None, help="comma-separated SSH pool sizes, one test host per "
                        "node (default " + ",".join(map(str, SSH_SIZES)) + ")")
    parser.add_argument("--no-local", action="store_true", help="SSH only")
    parser.add_argument("--print", action="store_true", help="print the section, do not write it")
    parser.add_argument("--against", default=None, help="another checkout (its root folder): Local sizes run "
                        "with its skyward too, interleaved; prints both tables and their ratios, writes nothing")
    args = parser.parse_args()
    if args.against:
        if args.no_local:  # SSH sizes, on the test hosts
            compare(tuple(int(n) for n in (args.ssh_sizes or "8,64").split(",")), args.reps or 1, args.against, True)
        else:
            compare(tuple(int(n) for n in (args.local_sizes or "2,64").split(",")), args.reps or 1, args.against)
        return
    reps = args.reps or (1 if args.quick else 3)
    load_start = loadavg()
    sizes = tuple(int(n) for n in args.local_sizes.split(",")) if args.local_sizes else LOCAL_SIZES
    local = {} if args.no_local else measure((1, 4, 16) if args.quick else sizes, reps, None)[0]
    ssh_sizes = tuple(int(n) for n in args.ssh_sizes.split(",")) if args.ssh_sizes else SSH_SIZES
    measured = None if args.quick or args.no_ssh else measure_ssh(ssh_sizes, reps)
    ssh = measured[0] if isinstance(measured, list) else measured
    section = report(local, ssh, reps, args.quick, load_start, os.cpu_count() or 1)
    print(section)
    if not args.quick and not args.print:
        write_section(OWNER, section)


if __name__ == "__main__":
    main()
