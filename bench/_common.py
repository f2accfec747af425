"""Small helpers shared by the benchmark cases and the runner: statistics, memory, machine facts.

Standard library only (numpy is used where present, never required here), so that importing
this module in a fresh case process costs next to nothing.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import resource
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

#: Marker in front of the one JSON line a case process prints as its result.
RESULT_MARK = "@@BENCH-RESULT "


# -- statistics ------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between closest ranks."""
    if not values:
        return math.nan
    data = sorted(values)
    if len(data) == 1:
        return float(data[0])
    pos = (len(data) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    if lo == hi:
        return float(data[lo])
    return float(data[lo] + (data[hi] - data[lo]) * (pos - lo))


def summarize(values: Sequence[float]) -> dict[str, float]:
    """Median and p10/p90 of a list of repeated measurements."""
    return {
        "n": len(values),
        "median": percentile(values, 50),
        "p10": percentile(values, 10),
        "p90": percentile(values, 90),
        "min": min(values) if values else math.nan,
        "max": max(values) if values else math.nan,
    }


# -- memory ----------------------------------------------------------------------------------------


def current_rss() -> int:
    """Resident set size of this process now, in bytes (Linux /proc)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def peak_rss() -> int:
    """High-water mark of this process's resident set size, in bytes (getrusage; KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# -- case protocol ---------------------------------------------------------------------------------


def emit_result(value: Any) -> None:
    """Print the case's result as the one marked JSON line the runner looks for."""
    sys.stdout.write(RESULT_MARK + json.dumps(value) + "\n")
    sys.stdout.flush()


def parse_result(stdout: str) -> Any:
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK):])
    raise ValueError("the case printed no result line")


# -- machine ---------------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _version(module: str) -> str:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:
        return "not installed"


def _hypervisor() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    m = re.search(r"Hypervisor vendor:\s*(\S+)", out)
    return m.group(1) if m else ""


def machine() -> dict[str, Any]:
    """What the report says about the machine the numbers came from."""
    try:
        load = os.getloadavg()
    except OSError:
        load = (math.nan, math.nan, math.nan)
    return {
        "cpu": _cpu_model(),
        "hypervisor": _hypervisor(),
        "cores": os.cpu_count(),
        "memory_gib": round(_mem_total() / 2**30, 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "python_impl": platform.python_implementation(),
        "versions": {m: _version(m) for m in ("skyward", "ray", "dask", "distributed", "torch", "numpy",
                                               "cloudpickle", "matplotlib")},
        "loadavg_at_start": [round(x, 2) for x in load],
    }
