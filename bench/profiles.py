"""Summaries of the profiles ``run.py`` takes: py-spy raw stacks and cProfile stats, as plain data.

py-spy (``record --format raw --threads``) writes one line per distinct stack::

    thread (TID): NAME;outer (file:line);...;leaf (file:line) COUNT

Each process is summarized by thread (samples, and the share of the profiled region's wall time
they cover), by the frames where samples end ("self": the code that was running) and by the
frames that appear anywhere on the stack ("inclusive"). py-spy drops samples of threads it
sees as idle, so the shares approximate time on CPU; its idle detection is a heuristic,
and a thread blocked in a lock with a timeout is sometimes counted as busy.
"""

from __future__ import annotations

import collections
import json
import os
import re
from typing import Any

_FRAME = re.compile(r"^(?P<fn>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def _short_file(path: str) -> str:
    for marker in ("site-packages/", "lib/python3.", "/work/main/"):
        if marker in path:
            tail = path.split(marker, 1)[1]
            return tail.split("/", 1)[1] if marker == "lib/python3." and "/" in tail else tail
    return path


def _frame_name(frame: str, *, line: bool) -> str:
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    where = _short_file(m.group("file"))
    if line and m.group("line"):
        where += f":{m.group('line')}"
    return f"{m.group('fn')} ({where})"


def parse_pyspy(path: str) -> list[tuple[str, list[str], int]]:
    """[(thread, frames outermost first, count)] from a py-spy raw file."""
    stacks = []
    with open(path) as f:
        for raw in f:
            raw = raw.rstrip("\n")
            if not raw.strip():
                continue
            body, _, count = raw.rpartition(" ")
            try:
                n = int(count)
            except ValueError:
                continue
            parts = body.split(";")
            thread = parts[0]
            m = re.match(r"thread \(\S+\):?\s*(.*)$", thread)
            thread = (m.group(1) or "main") if m else thread
            if thread.startswith("process "):
                thread = "main"
            stacks.append((thread or "main", parts[1:], n))
    return stacks


def summarize_pyspy(directory: str, top: int = 12) -> dict[str, Any]:
    region = {}
    region_file = os.path.join(directory, "region.json")
    if os.path.exists(region_file):
        with open(region_file) as f:
            region = json.load(f)
    possible = region.get("seconds", 0) * region.get("rate", 0)
    out: dict[str, Any] = {"region_seconds": region.get("seconds"), "rate": region.get("rate"), "processes": {}}
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".txt"):
            continue
        stacks = parse_pyspy(os.path.join(directory, name))
        total = sum(n for _, _, n in stacks)
        threads: collections.Counter[str] = collections.Counter()
        leaf: collections.Counter[str] = collections.Counter()
        inclusive: collections.Counter[str] = collections.Counter()
        for thread, frames, n in stacks:
            threads[thread] += n
            if frames:
                leaf[f"[{thread}] " + _frame_name(frames[-1], line=True)] += n
            for fr in dict.fromkeys(_frame_name(x, line=False) for x in frames):
                inclusive[fr] += n
        out["processes"][name[:-4]] = {
            "samples": total,
            "threads": [(t, n, n / possible if possible else None) for t, n in threads.most_common()],
            "self": [(fr, n, n / total) for fr, n in leaf.most_common(top)] if total else [],
            "inclusive": [(fr, n, n / total) for fr, n in inclusive.most_common(top + 8)] if total else [],
        }
    return out


def summarize_cprofile(path: str, top: int = 15) -> dict[str, Any]:
    import pstats

    stats = pstats.Stats(path)
    rows = []
    for (file, line, fn), (cc, nc, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append({"fn": f"{fn} ({_short_file(file)}:{line})", "ncalls": nc, "tottime": tt, "cumtime": ct})
    total = stats.total_tt  # type: ignore[attr-defined]
    by_tot = sorted(rows, key=lambda r: r["tottime"], reverse=True)[:top]
    by_cum = sorted(rows, key=lambda r: r["cumtime"], reverse=True)[: top + 10]
    return {"total_seconds": total, "by_tottime": by_tot, "by_cumtime": by_cum}


def _perf_table(path: str, sort: str, limit: float) -> list[tuple[float, str]]:
    import subprocess

    done = subprocess.run(["perf", "report", "-i", path, "--stdio", "--no-children", "--sort", sort, "-g", "none",
                           "--percent-limit", str(limit)], capture_output=True, text=True, timeout=120)
    rows = []
    for line in done.stdout.splitlines():
        m = re.match(r"^\s+([\d.]+)%\s+(.*)$", line)
        if m:
            what = re.sub(r"\s+", " ", m.group(2)).strip()
            rows.append((float(m.group(1)), what if len(what) <= 110 else what[:107] + "..."))
    return rows


def summarize_perf(path: str, top: int = 10) -> dict[str, Any]:
    """perf samples of one process (every thread, native frames) by thread/library and by symbol."""
    return {
        "by_thread_and_library": _perf_table(path, "comm,dso", 1.0)[:top],
        "by_symbol": _perf_table(path, "dso,sym", 1.0)[:top],
    }


def summarize_strace(directory: str, calls: int) -> dict[str, Any]:
    """System calls per task from ``strace -f -c`` files (client.strace, worker0.strace, ...)."""
    out: dict[str, Any] = {}
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".strace"):
            continue
        rows = []
        with open(os.path.join(directory, name)) as f:
            for line in f:
                parts = line.split()
                # % time, seconds, usecs/call, calls, [errors], syscall
                if len(parts) >= 5 and parts[0].replace(".", "").isdigit() and parts[-1] != "total":
                    rows.append((parts[-1], int(parts[3])))
        out[name[:-7]] = sorted(((sc, n / calls) for sc, n in rows), key=lambda r: -r[1])
    return out
