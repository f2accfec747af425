"""Helpers shared by the cases and the runner: statistics, memory, the result line, the machine.

Standard library only, so that importing this module in a fresh case process costs next to nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import resource
import subprocess
import sys
from collections.abc import Iterator, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any

#: Marker in front of the one JSON line a case process prints as its result.
RESULT_MARK = "@@BENCH-RESULT "


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear interpolation between closest ranks."""
    if not values:
        return math.nan
    data = sorted(values)
    pos = (len(data) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return float(data[lo] + (data[hi] - data[lo]) * (pos - lo))


def by_system(section: dict[str, Any], field: str | None = None) -> dict[str, list[Any]]:
    """{system: [its result in each repetition]}: the job's key is the system, or (with ``field``)
    the keys of the job's ``result[field]`` (a process that measured several systems)."""
    out: dict[str, list[Any]] = {}
    for rep in section["reps"]:
        for key, r in rep.items():
            for system, value in r[field].items() if field else [(key, r)]:
                out.setdefault(system, []).append(value)
    return out


def current_rss() -> int:
    """Resident set size of this process now, in bytes (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss() -> int:
    """High-water mark of this process's resident set size, in bytes (getrusage: KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return [math.nan] * 3


def emit_result(value: Any) -> None:
    sys.stdout.write(RESULT_MARK + json.dumps(value) + "\n")
    sys.stdout.flush()


def parse_result(stdout: str) -> Any:
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK):])
    raise ValueError("the case printed no result line")


def _first(path: str, key: str) -> str:
    try:
        with open(path) as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith(key)), "")
    except OSError:
        return ""


def _version(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


def machine() -> dict[str, Any]:
    """What the page says about the machine the numbers came from."""
    mem_kib = _first("/proc/meminfo", "MemTotal").split()
    return {
        "cpu": _first("/proc/cpuinfo", "model name") or platform.processor() or "unknown",
        "cores": os.cpu_count(),
        "memory_gib": round(int(mem_kib[0]) / 2**20, 1) if mem_kib else math.nan,
        "os": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "versions": {d: _version(d) for d in ("skyward", "ray", "dask", "distributed", "torch", "numpy",
                                               "cloudpickle")},
        "loadavg_at_start": loadavg(),
    }


PAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "benchmarks.md")


def section_markers(owner: str) -> tuple[str, str]:
    """The comments around the section of docs/benchmarks.md that ``owner`` (a script) writes."""
    return f"<!-- {owner}: begin -->", f"<!-- {owner}: end -->"


def write_section(owner: str, section: str) -> None:
    """Put ``section`` between ``owner``'s markers in docs/benchmarks.md (appended the first time);
    the rest of the page is left as it is (bench/run.py keeps such sections when it rewrites it)."""
    begin_mark, end_mark = section_markers(owner)
    block = f"{begin_mark}\n{section}\n{end_mark}"
    text = open(PAGE).read() if os.path.exists(PAGE) else "# Benchmarks\n"
    begin, end = text.find(begin_mark), text.find(end_mark)
    if 0 <= begin < end:
        text = text[:begin] + block + text[end + len(end_mark):]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    with open(PAGE, "w") as f:
        f.write(text)


#: What the SSH test hosts install from (they cannot reach an index): skyward's dependencies and uv.
WHEELHOUSE_REQUIREMENTS = ("uv", "cloudpickle>=2.1", "pydantic>=2.5", "rich>=13")


def hosts_wheelhouse() -> str:
    """Wheels for the SSH test hosts, downloaded once into /tmp and reused."""
    key = hashlib.sha256(json.dumps([WHEELHOUSE_REQUIREMENTS, sys.version_info[:2], platform.machine()])
                         .encode()).hexdigest()[:12]
    directory = os.path.join("/tmp/skyward-bench-wheelhouse", key)
    if not os.path.exists(os.path.join(directory, ".complete")):
        staging = f"{directory}.{os.getpid()}.partial"
        done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", staging,
                               *WHEELHOUSE_REQUIREMENTS], capture_output=True, text=True, timeout=300, check=False)
        if done.returncode != 0:
            raise RuntimeError("pip download of the hosts' wheelhouse failed: " + done.stderr[-500:])
        open(os.path.join(staging, ".complete"), "w").close()
        try:
            os.rename(staging, directory)
        except OSError:  # another run finished first
            subprocess.run(["rm", "-rf", staging], check=False)
    return directory


def run_section(owner: str, doc: str | None, name: str, measure: Any, section: Any,
                nodes: tuple[int, int] | None = None) -> None:
    """The ``main`` of a script that writes one section of docs/benchmarks.md: ``--quick``
    (a smoke test: printed, not written), the raw figures in bench/results/NAME.json. With
    ``nodes`` (the default with ``--quick``, and without), ``--nodes N`` too, and ``measure``
    is given it."""
    import argparse

    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    if nodes is not None:
        parser.add_argument("--nodes", type=int, help=f"how many nodes (default {nodes[1]}; with --quick {nodes[0]})")
    args = parser.parse_args()
    if nodes is None:
        r = measure(args.quick)
    else:
        r = measure(args.quick, args.nodes or nodes[0 if args.quick else 1])
    results = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(results, exist_ok=True)
    with open(os.path.join(results, f"{name}.json"), "w") as f:
        json.dump(r, f, indent=1)
    text = section(r, args.quick)
    print(text)
    if not args.quick:
        write_section(owner, text)


# -- the dashboard scripts (bench/dashboard*.py) ---------------------------------------------------

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
#: What every node of a chatty job runs (RATE lines a second, in a batch every EVERY seconds; a
#: batch's last line ends with `` sent TIME``, the time it was printed, for the log page's lag).
#: No double quote, dollar or backslash: it goes inside the run block's ``python3 -c "..."``.
_PRINTER = """\
import sys, time
rate, every = RATE, EVERY
i, t, due = 0, time.monotonic(), 0.0
while True:
    due += rate * every
    n = int(due) - i
    out = ['line %d of a job that prints ten thousand lines a second' % (i + k) for k in range(n)]
    if out: out[-1] += ' sent %.3f' % time.time()
    sys.stdout.write(''.join(s + chr(10) for s in out)); sys.stdout.flush()
    i, t = i + n, t + every
    time.sleep(max(0.0, t - time.monotonic()))
"""


def chatty_job(nodes: int, lines_per_second: float, every: float = 0.1) -> str:
    """A task file: ``nodes`` nodes printing ``lines_per_second`` lines a second in all, until cancelled."""
    program = _PRINTER.replace("RATE", repr(lines_per_second / nodes)).replace("EVERY", repr(every))
    body = "".join(f"  {line}\n" for line in program.splitlines())
    return f'name: chatty\nnum_nodes: {nodes}\nrun: |\n  python3 -u -c "\n{body}  "\n'


def cpu_seconds(pid: int) -> tuple[float, float]:
    """Process ``pid``'s CPU seconds (user + system): its own, and those of its ended children
    (on Local, the node-side reads a dashboard server runs are its children)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick


def sky(*args: str, cwd: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``skyward ARGS`` (this checkout's), in ``cwd``."""
    return subprocess.run([sys.executable, "-m", "skyward.cli", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": ROOT}, timeout=timeout)


class Dashboard:
    """A ``skyward dashboard`` server of its own (in ``cwd``, SKYWARD_HOME as this process's),
    started and listening; :meth:`close` ends it."""

    def __init__(self, cwd: str):
        self.process = subprocess.Popen([sys.executable, "-m", "skyward.cli", "dashboard", "--port", "0",
                                         "--no-browser"], cwd=cwd, env={**os.environ, "PYTHONPATH": ROOT},
                                        stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        self.url = self.process.stdout.readline().split()[-1]  # (http://127.0.0.1:PORT/?token=...)
        self.base = self.url.split("/?")[0]
        self.port, self.token = int(self.base.rsplit(":", 1)[1]), self.url.split("token=")[1]
        self.pid = self.process.pid

    def get(self, path: str) -> Any:
        """The JSON answer to GET ``path``, as a page asks it (RuntimeError: not 200)."""
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            conn.request("GET", path, headers={"Host": f"127.0.0.1:{self.port}",
                                               "Cookie": f"skyward_dashboard_{self.port}={self.token}"})
            reply = conn.getresponse()
            body = reply.read()
            if reply.status != 200:
                raise RuntimeError(f"{path}: {reply.status} {body[:300]!r}")
            return json.loads(body)
        finally:
            conn.close()

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:  # (a poll of every node still answering)
            self.process.kill()
            self.process.wait(30)


    def __enter__(self) -> Dashboard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def bench_home(prefix: str) -> Iterator[str]:
    """A folder of its own for the block, SKYWARD_HOME in it (the clusters' state): removed after."""
    import shutil
    import tempfile

    work, before = tempfile.mkdtemp(prefix=prefix), os.environ.get("SKYWARD_HOME")
    os.environ["SKYWARD_HOME"] = work
    try:
        yield work
    finally:
        if before is None:
            os.environ.pop("SKYWARD_HOME", None)
        else:
            os.environ["SKYWARD_HOME"] = before
        shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def cluster(name: str, cwd: str, *args: str, timeout: float = 300) -> Iterator[None]:
    """Cluster ``name`` launched (``skyward launch -c NAME ARGS``) for the block and ended after,
    also when its launch failed or timed out (a loaded machine may not confirm its workers gone at
    once: the down is asked again)."""
    try:
        done = sky("launch", "-c", name, *args, cwd=cwd, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"skyward launch -c {name} failed: {done.stderr[-2000:]}")
        yield
    finally:
        for _ in range(3):
            try:
                if sky("down", name, "-y", cwd=cwd).returncode == 0:
                    break
            except subprocess.TimeoutExpired:
                pass


def window(server: int, workers: list[int], seconds: float, ask: Any = None, every: float = 3.0) -> dict[str, Any]:
    """CPU over ``seconds``, in cores: dashboard server ``server``'s own (``server``), its ended
    children's (``node_commands``: on Local, the commands it runs for the nodes) and the
    ``workers``' processes'; calling ``ask()`` every ``every`` seconds meanwhile if given (each
    call's time in ``polls``); the load average at the end."""
    import threading
    import time

    stop = threading.Event()
    polls: list[float] = []

    def watch() -> None:
        while not stop.is_set():
            asked = time.monotonic()
            ask()
            polls.append(time.monotonic() - asked)
            stop.wait(max(0.0, every - (time.monotonic() - asked)))

    cpu0, kids0, t0 = *cpu_seconds(server), time.monotonic()
    w0 = sum(cpu_seconds(pid)[0] for pid in workers)
    thread = threading.Thread(target=watch) if ask is not None else None
    if thread is not None:
        thread.start()
    time.sleep(seconds)
    stop.set()
    if thread is not None:
        thread.join()
    cpu1, kids1, wall = *cpu_seconds(server), time.monotonic() - t0
    w1 = sum(cpu_seconds(pid)[0] for pid in workers)
    return {"wall": wall, "server": (cpu1 - cpu0) / wall, "node_commands": (kids1 - kids0) / wall,
            "workers": (w1 - w0) / wall, "polls": polls, "load": loadavg()[0]}


def generated(script: str, quick: bool, r: dict[str, Any]) -> str:
    """The line under a section's title: how it was made, when, and the load around it."""
    import time

    return (f"*Generated by `python {script}{' --quick' if quick else ''}` on {time.strftime('%Y-%m-%dT%H:%M:%S%z')}; "
            f"load average {r['load_start'][0]:.2f} at the start, {r['load_end'][0]:.2f} at the end. Re-running it "
            "rewrites this section only.*")
