"""Helpers shared by the cases and the runner: statistics, memory, the result line, the machine.

Standard library only, so that importing this module in a fresh case process costs next to nothing.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import resource
import subprocess
import sys
from collections.abc import Sequence
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


def run_section(owner: str, doc: str | None, name: str, measure: Any, section: Any) -> None:
    """The ``main`` of a script that writes one section of docs/benchmarks.md: ``--quick``
    (a smoke test: printed, not written), the raw figures in bench/results/NAME.json."""
    import argparse

    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    r = measure(args.quick)
    results = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(results, exist_ok=True)
    with open(os.path.join(results, f"{name}.json"), "w") as f:
        json.dump(r, f, indent=1)
    text = section(r, args.quick)
    print(text)
    if not args.quick:
        write_section(owner, text)
