"""What a cluster page shows of a node, read on the node by its resident worker when asked.

The dashboard asks a node's first worker ``look NODE`` on its control socket
(:meth:`skyward.worker.resident.Resident.answer`) and gets one JSON line: the node's CPU %,
memory, GPUs where ``nvidia-smi`` exists, its part of the cluster's job queue and the spot
notices its worker heard. The worker
already runs, so a look starts no process (but ``nvidia-smi`` where there is one) and costs the
node a few reads of ``/proc`` and of the queue's database; nothing is read between asks: no
page, no cost.

Guarantees:

1. ``cpu`` is the node's busy share since the previous look (a page asks every few seconds, so
   it is the figure of the last seconds); a first look, or one after :data:`FRESH` seconds
   without any, waits :data:`GAP` seconds between two reads instead.
2. ``gpus`` is None where the node has no ``nvidia-smi``, [] where it failed, else per GPU
   ``util`` (%), ``memory_used`` and ``memory_total`` (MiB) from its documented ``--query-gpu``
   CSV.
3. ``notices``: the spot preemption notices this worker has heard (a spot node's worker
   watches for them: :mod:`skyward.worker.preemption`), each ``kind``, ``action``, ``at`` and
   ``heard`` (when the worker read it; seconds since the epoch, by the node's clock); kept by
   the worker, so every look says them again, and the timeline written at a look bears the
   time each was heard, not the time of the look.
4. Nothing raises for a figure that cannot be read: the look says ``error`` instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from typing import Any

__all__ = ["FRESH", "GAP", "GPU_QUERY", "NodeLook", "busy", "gpu_rows"]

#: Seconds between the two reads of a look with no recent one before it.
GAP = 0.3
#: A previous look older than this is not the base of the next one's CPU figure.
FRESH = 30.0
#: The arguments ``nvidia-smi`` is run with (its documented CSV query).
GPU_QUERY = ("--query-gpu=utilization.gpu,memory.used,memory.total", "--format=csv,noheader,nounits")


def busy(before: list[int], after: list[int]) -> float:
    """The busy % between two readings of ``/proc/stat``'s ``cpu`` line (its numbers)."""
    total = sum(after) - sum(before)
    idle = (after[3] + after[4]) - (before[3] + before[4])
    return round(100.0 * (1 - idle / total), 1) if total > 0 else 0.0


def gpu_rows(text: str) -> list[dict[str, float]]:
    """``nvidia-smi``'s :data:`GPU_QUERY` output, one dict per GPU (ValueError: not figures)."""
    return [dict(zip(("util", "memory_used", "memory_total"), (float(x) for x in line.split(",")), strict=True))
            for line in text.splitlines() if line.strip()]


def _cpu_times() -> list[int]:
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:]]


def _memory() -> tuple[int, int]:
    """(bytes in use, bytes in all)."""
    found: dict[str, int] = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("MemTotal", "MemAvailable"):
                found[key] = int(value.split()[0]) * 1024
            if len(found) == 2:
                break
    return found["MemTotal"] - found["MemAvailable"], found["MemTotal"]


def _gpus() -> list[dict[str, float]] | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        done = subprocess.run([smi, *GPU_QUERY], capture_output=True, text=True, timeout=10)
        return gpu_rows(done.stdout) if done.returncode == 0 else []
    except (OSError, subprocess.SubprocessError, ValueError):
        return []


class NodeLook:
    """The node's figures, read when asked; the CPU reading of the last look is kept."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: tuple[float, list[int]] | None = None

    def cpu(self) -> float:
        now, reading = time.monotonic(), _cpu_times()
        with self._lock:
            last, self._last = self._last, (now, reading)
        if last is None or now - last[0] > FRESH or now - last[0] < GAP / 3:
            time.sleep(GAP)
            last, reading = (now, reading), _cpu_times()
            with self._lock:
                self._last = (time.monotonic(), reading)
        return busy(last[1], reading)

    def look(self, base: str, node: int) -> dict[str, Any]:
        """The node's figures and its part of the job queue in folder ``base``
        (:func:`skyward.runtime.jobtool.rows`)."""
        from skyward.runtime import jobqueue, jobtool, preemption

        try:
            used, total = _memory()
            queued = os.path.exists(os.path.join(base, jobqueue.DATABASE))  # (no queue yet: no job)
            return {"cpu": self.cpu(), "memory_used": used, "memory_total": total, "gpus": _gpus(),
                    "rows": jobtool.rows(base, node) if queued else [],
                    "notices": [{"kind": n.kind, "action": n.action, "at": n.at.timestamp(),
                                 "heard": n.heard.timestamp() if n.heard is not None else None}
                                for n in preemption.notices()]}
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {exc}"[:300]}
