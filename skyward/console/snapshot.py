"""A running pool's figures for ``skyward dashboard``: a pool that opts in
(``ComputePool(dashboard=True)``, or ``SKYWARD_DASHBOARD=1`` in its environment) writes a small
JSON snapshot, ``$SKYWARD_HOME/pools/PID-POOL.json``, and the dashboard lists those whose
writer is alive.

Built from the pool's events alone, with the console's own counts
(:class:`~skyward.console.state.ConsoleState`): nodes and their stage, tasks running, done,
failed and cancelled, tasks finished per second over the last seconds. Written at most once a
second, by a thread of its own (never on the pool's dispatch path), replaced whole (a reader
never sees half a file), and removed when the pool stops; a snapshot whose process died without
removing it is removed by the next reader. It holds no argument, output or environment of any
task: counts, stages, the pool's id and provider, and the script's file name.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from skyward import events as ev
from skyward._home import home
from skyward.console.state import ConsoleState
from skyward.errors import ConfigError

__all__ = ["ENV", "EVERY", "Snapshot", "folder", "live", "wanted"]

#: The environment variable that makes every pool of a process show in the dashboard.
ENV = "SKYWARD_DASHBOARD"
#: Seconds between two writes of a snapshot, at least.
EVERY = 1.0
#: Tasks per second are counted over this many last seconds.
RATE_WINDOW = 10.0


def wanted(given: bool) -> bool:
    """Whether a pool shows in the dashboard: ``dashboard=True``, or ``SKYWARD_DASHBOARD=1``."""
    value = os.environ.get(ENV, "")
    if value not in ("", "0", "1"):
        raise ConfigError(ENV, "1 (show running pools in skyward dashboard), 0 or unset", value)
    return given or value == "1"


def folder() -> Path:
    """Where the snapshots are: ``$SKYWARD_HOME/pools``."""
    return home() / "pools"


class Snapshot:
    """A pool's event subscriber that keeps its snapshot file current while the pool runs."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.state = ConsoleState(live=False, verbose=False, now=time.monotonic())
        self.finished: deque[float] = deque()
        self.started = time.time()
        self.path: Path | None = None
        self.stopped = threading.Event()
        self.writer: threading.Thread | None = None

    def __call__(self, event: ev.Event) -> None:
        if isinstance(event, (ev.TaskOutput, ev.NodeLog)):
            return  # (no count changes with them)
        with self.lock:
            now = time.monotonic()
            self.state.apply(event, now)
            if isinstance(event, ev.TaskFinished):
                self.finished.append(now)
            if isinstance(event, ev.PoolStarting):
                self.started, self.finished = time.time(), deque()
                self.path = folder() / f"{os.getpid()}-{event.pool_id}.json"
                if self.writer is None:
                    self.stopped.clear()
                    self.writer = threading.Thread(target=self.keep, name="skyward-dashboard-snapshot", daemon=True)
                    self.writer.start()
        if isinstance(event, ev.PoolStopped):
            self.close()

    def figures(self) -> dict[str, Any]:
        """The snapshot as written (under the lock)."""
        now = time.monotonic()
        while self.finished and self.finished[0] < now - RATE_WINDOW:
            self.finished.popleft()
        span = min(RATE_WINDOW, max(time.time() - self.started, 1.0))
        state = self.state
        nodes = [{"node": n, "stage": s.stage, "host": s.host, "running": len(s.running), "done": s.done,
                  "failed": s.failed, "cancelled": s.cancelled} for n, s in sorted(state.nodes.items())]
        total = {k: sum(n[k] for n in nodes) for k in ("running", "done", "failed", "cancelled")}
        return {"pid": os.getpid(), "pool": state.pool_id, "provider": state.provider,
                "script": os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "",
                "started": self.started, "updated": time.time(), "nodes": nodes, **total,
                "tasks_per_second": round(len(self.finished) / span, 2)}

    def keep(self) -> None:
        """(Its thread) Write the snapshot now, then every :data:`EVERY` seconds until closed."""
        while True:
            with self.lock:
                path, text = self.path, json.dumps(self.figures())
            if self.stopped.is_set() or path is None:
                return
            with contextlib.suppress(OSError):  # (a home that cannot be written: no snapshot, the pool runs on)
                path.parent.mkdir(mode=0o700, exist_ok=True)
                part = path.with_suffix(".part")
                part.write_text(text)
                os.replace(part, path)
            if self.stopped.wait(EVERY):
                return

    def close(self) -> None:
        """Stop writing and remove the snapshot (the pool stopped)."""
        self.stopped.set()
        writer, self.writer = self.writer, None
        if writer is not None and writer is not threading.current_thread():
            writer.join(10)
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # (another user's: alive)
        return True
    return True


def live() -> list[dict[str, Any]]:
    """The snapshots of pools running now, oldest first; one whose writer is gone is removed."""
    found = []
    place = folder()
    for path in place.glob("*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):  # (removed as it was read)
            continue
        if not isinstance(data, dict) or not _alive(data.get("pid")):
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        found.append(data)
    return sorted(found, key=lambda d: d.get("started", 0))
