"""The script side of a cluster's job queue (:mod:`skyward.runtime.jobqueue`): what a
``skyward`` process anywhere asks of a node, run there with the node's Python as
``python -I -S jobtool.py BASE NODE rows | cancel all|ID... | follow ID 0|1 TAIL | read ID@OFFSET LIMIT |
result ID WAIT``
(its path is in ``$SKYWARD_CLUSTER_DIR/jobqueue.path``). Standard library only: it loads the queue and skyward's
/proc reader by their paths, so it starts fast in any environment.

``rows`` prints the node's part of every job (JSON); ``cancel`` marks the jobs CANCELLED, has
each one's command guardian end its whole process tree, and waits until none of it is left;
``follow`` copies a job's log to stdout until the job has ended on the node; ``read`` prints the
part of a job's log after a byte offset (what the dashboard asks every second); ``result`` waits
(a bounded time) for the job to end on the node and prints how it ended, with what a spawned
call kept (:mod:`skyward.runtime.spawned`).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any

#: The line ``follow`` ends with on stderr: ``END_MARK STATUS EXIT_CODE`` (``-``: none).
END_MARK = "skyward-job-end"
#: Lines of a failed job's log that ``result`` sends.
TAIL_LINES = 20


def _load(name: str) -> ModuleType:
    """A file of skyward by its path (``runtime/jobqueue.py``), as module ``_skyward_<stem>``."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), *name.split("/"))
    spec = importlib.util.spec_from_file_location("_skyward_" + os.path.basename(name)[:-3].lstrip("_"), path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _queue() -> ModuleType:
    if __name__ != "__main__":
        from skyward.runtime import jobqueue

        return jobqueue
    _load("_procs.py")
    return _load("runtime/jobqueue.py")


q = _queue()


def _spawned() -> ModuleType:
    """:mod:`skyward.runtime.spawned` (its limits), loaded as the queue is."""
    if __name__ != "__main__":
        from skyward.runtime import spawned

        return spawned
    return sys.modules.get("_skyward_spawned") or _load("runtime/spawned.py")


def rows(base: str, node: int) -> list[dict[str, Any]]:
    """Node ``node``'s part of every job, oldest first."""
    conn = q.connect(base)
    try:
        with q._transaction(conn):
            q._reconcile(conn, q._load_procs())
        found = conn.execute("SELECT j.id, j.name, j.submitted, j.resources, j.nodes, t.node, t.status, t.exit_code, "
                             "t.started, t.ended FROM tasks t JOIN jobs j ON j.id = t.job WHERE t.node = ? "
                             "ORDER BY j.id", (node,)).fetchall()
        return [dict(r) for r in found]
    finally:
        conn.close()


def cancel(base: str, node: int, jobs: list[int] | None) -> dict[str, list[int]]:
    """Cancel node ``node``'s part of ``jobs`` (None: every job not ended): a pending one is
    CANCELLED at once; a running one's guardian ends its whole process tree, and the worker marks
    it CANCELLED once the guardian has confirmed none of it is left. Returns the jobs cancelled
    and the pids left (none unless something could not be killed)."""
    import signal

    procs = q._load_procs()
    conn = q.connect(base)
    try:
        with q._transaction(conn):
            q._reconcile(conn, procs)
            where = "" if jobs is None else f" AND job IN ({','.join('?' * len(jobs))})"
            found = conn.execute(f"SELECT job, status, pid FROM tasks WHERE node = ? AND status IN (?,?,?){where}",
                                 (node, *q.ACTIVE, *(jobs or []))).fetchall()
            for r in found:
                if r["status"] == q.PENDING:
                    conn.execute("UPDATE tasks SET status=?, ended=?, spec=NULL WHERE job=? AND node=?",
                                 (q.CANCELLED, time.time(), r["job"], node))
                    with contextlib.suppress(FileNotFoundError):  # (a spawned call that will never run)
                        os.unlink(os.path.join(os.path.dirname(q.log_path(base, node, r["job"])), f"{r['job']}.call"))
                else:
                    conn.execute("UPDATE tasks SET cancelling=1 WHERE job=? AND node=?", (r["job"], node))
        watched: set[int] = set()
        for r in found:
            pid = r["pid"]
            if r["status"] != q.PENDING and pid and procs.alive(pid) and _is_guardian(pid):
                watched |= {pid, *procs.descendants(pid, zombies=False)}
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGTERM)  # (the guardian ends the job's whole tree, then itself)
        ids = [r["job"] for r in found]
        deadline = time.monotonic() + q.GRACE + 10
        while time.monotonic() < deadline:
            running = conn.execute(f"SELECT 1 FROM tasks WHERE node=? AND status IN (?,?) AND job IN "
                                   f"({','.join('?' * len(ids))})", (node, q.SETTING_UP, q.RUNNING, *ids)).fetchone()
            if not running and not any(procs.alive(p) for p in watched):
                break
            time.sleep(0.05)
    finally:
        conn.close()
    return {"cancelled": ids, "left": [p for p in watched if procs.alive(p)]}


def _is_guardian(pid: int) -> bool:  # (not a process that took a finished guardian's id)
    return b"_reaper.py" in (q._load_procs().cmdline(pid) or b"")


def _state(base: str, node: int, job: int) -> tuple[str, int | None, float | None] | None:
    """Node ``node``'s part of ``job``: (status, exit code, when it ended); None when it has none."""
    conn = q.connect(base)
    try:
        r = conn.execute("SELECT status, exit_code, owner, ended FROM tasks WHERE job=? AND node=?",
                         (job, node)).fetchone()
    finally:
        conn.close()
    if r is not None and r["status"] in q.ACTIVE and not q._load_procs().alive(r["owner"] or 0):
        return q.FAILED_DRIVER, None, None  # (its worker is gone: it will never end by itself)
    return None if r is None else (r["status"], r["exit_code"], r["ended"])


def pauses() -> Iterator[float]:
    """Seconds between looks at a job's part that has not ended, or at its log with no new bytes:
    5 ms at first, 1.5 times longer each look, then ``FOLLOW_POLL``. A short job ends within the
    first looks (``skyward exec NAME true`` waited a whole FOLLOW_POLL, 0.2 s, for it); a long
    one is looked at every FOLLOW_POLL after its first half second."""
    pause = 0.005
    while True:
        yield pause
        pause = min(q.FOLLOW_POLL, pause * 1.5)


def watch(pid_file: str, pause: float) -> None:
    """Wait ``pause`` seconds, or less: until ``pid_file`` (a job's command running: the queue
    removes it as the command ends, just before it writes how it ended) goes away, looked at
    every 5 ms. A look is one ``stat``, where a look at the job's state opens its database: a
    short job's end is seen within milliseconds, not at the next of the growing pauses. Without
    the file (the command has just ended, and its end is being written; or a setup gives way to
    its run) the wait is at most 20 ms."""
    until = time.monotonic() + pause
    if not os.path.exists(pid_file):
        time.sleep(min(pause, 0.02))
        return
    while (left := until - time.monotonic()) > 0 and os.path.exists(pid_file):
        time.sleep(min(0.005, left))


def follow(base: str, node: int, job: int, *, keep_following: bool, tail: int, appear: float = 0.0) -> int:
    """Write node ``node``'s log of ``job`` to stdout (the last ``tail`` lines first, all when
    negative); with ``keep_following``, until the job has ended there, then its end on stderr as
    ``END_MARK STATUS EXIT_CODE`` (what the follower reports once the cluster may be gone). 102:
    no such job, after waiting up to ``appear`` seconds for it to be queued (a follower started
    as its job is being queued)."""
    def state() -> tuple[str, int | None] | None:
        found = _state(base, node, job)
        return None if found is None else found[:2]

    now = state()
    looks = pauses()
    until = time.monotonic() + appear
    while now is None and time.monotonic() < until:
        time.sleep(next(looks))
        now = state()
    if now is None:
        return 102
    while keep_following and now[0] == q.PENDING:
        time.sleep(next(looks))
        now = state() or now
    out = sys.stdout.buffer
    path = q.log_path(base, node, job)
    running = os.path.join(os.path.dirname(path), f"{job}.pid")  # (there while a command of the job runs)
    with contextlib.suppress(FileNotFoundError), open(path, "rb") as f:
        if tail >= 0:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 1_000_000))
            lines = f.read().splitlines(keepends=True)
            out.write(b"".join(lines[-tail:] if tail else []))
        while True:
            data = f.read()
            if data:
                out.write(data)
                out.flush()
                continue
            if not keep_following or now[0] not in q.ACTIVE:
                break
            watch(running, next(looks))
            now = state() or now
    out.flush()
    if keep_following:
        print(END_MARK, now[0], "-" if now[1] is None else now[1], file=sys.stderr, flush=True)
    return 0


def read(base: str, node: int, job: int, offset: int, limit: int) -> dict[str, Any] | None:
    """Node ``node``'s log of ``job`` after byte ``offset`` (negative: from the first line that
    starts in its last ``-offset`` bytes): ``text``, at most ``limit`` bytes ending at a line's end
    (a last line without its newline once the part has ended; a line longer than ``limit`` in
    pieces), ``start`` (the byte it starts at), ``offset`` after it, the part's ``status``. Only
    those bytes are read, whatever the log's size. None: no such job."""
    found = _state(base, node, job)  # (before the log: an ended part's log is whole)
    if found is None:
        return None
    data, start = b"", max(0, offset)
    with contextlib.suppress(FileNotFoundError), open(q.log_path(base, node, job), "rb") as f:
        if offset < 0:
            start = max(0, os.fstat(f.fileno()).st_size + offset)
            f.seek(max(0, start - 1))
            start += len(f.readline(-offset)) - 1 if start else 0
        f.seek(start)
        data = f.read(limit)
    if len(data) < limit and found[0] not in q.ACTIVE:
        taken = data
    else:
        taken = data[:data.rfind(b"\n") + 1] or data[:limit if len(data) == limit else 0]
    return {"text": taken.decode(errors="replace"), "start": start, "offset": start + len(taken), "status": found[0]}


#: What :func:`answer` gives without a process (the dashboard's server asks it on this machine).
READS = ("rows", "read")


def answer(base: str, node: int, what: str, rest: list[str]) -> tuple[int, str]:
    """``rows`` or ``read ID@OFFSET LIMIT``: (exit code, what the tool prints)."""
    if what == "rows":
        return 0, json.dumps(rows(base, node))
    job, offset = rest[0].split("@")
    found = read(base, node, int(job), int(offset), int(rest[1]))
    return (102, "") if found is None else (0, json.dumps(found))


def result(base: str, node: int, job: int, wait: float) -> int:
    """Wait up to ``wait`` seconds for node ``node``'s part of ``job`` to end, then print it as
    JSON: status, exit code, whether it ended more than ``KEEP_SECONDS`` ago (``expired``), for a
    spawned call its marker (``spawn``) and kept result (``result``, base64), and for a failed
    part the last lines of its log (``tail``). 102: no such job."""
    import base64

    deadline = time.monotonic() + wait
    now = _state(base, node, job)
    looks = pauses()
    while now is not None and now[0] in q.ACTIVE and time.monotonic() < deadline:
        time.sleep(next(looks))
        now = _state(base, node, job)
    if now is None:
        return 102
    status, code, ended = now
    folder = os.path.dirname(q.log_path(base, node, job))
    answer: dict[str, Any] = {"status": status, "exit_code": code, "spawn": None, "result": None, "tail": [],
                              "expired": bool(ended) and time.time() - ended > _spawned().KEEP_SECONDS}
    with contextlib.suppress(FileNotFoundError), open(os.path.join(folder, f"{job}.spawn")) as f:
        answer["spawn"] = json.load(f)
    if status not in q.ACTIVE and not answer["expired"]:
        with contextlib.suppress(FileNotFoundError), open(os.path.join(folder, f"{job}.result"), "rb") as f:
            answer["result"] = base64.b64encode(f.read()).decode()
    if status not in q.ACTIVE and status != q.SUCCEEDED:
        with contextlib.suppress(FileNotFoundError), open(q.log_path(base, node, job), "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 100_000))
            answer["tail"] = f.read().decode(errors="replace").splitlines()[-TAIL_LINES:]
    print(json.dumps(answer))
    return 0


def main(argv: list[str]) -> int:
    """``jobqueue.py BASE NODE rows | cancel all|ID... | follow ID 0|1 TAIL [APPEAR] | read ID@OFFSET
    LIMIT | result ID WAIT`` (run by its path). (``read``'s ``ID@OFFSET`` is one word so that a tool of
    before ``read`` fails on it at once, exit 1, and its caller falls back to ``follow``.)"""
    base, node, what, rest = argv[1], int(argv[2]), argv[3], argv[4:]
    if what == "rows":
        print(answer(base, node, what, rest)[1])
        return 0
    if what == "read":
        code, text = answer(base, node, what, rest)
        print(text, end="\n" if text else "")
        return code
    if what == "cancel":
        print(json.dumps(cancel(base, node, None if rest == ["all"] else [int(x) for x in rest])))
        return 0
    if what == "result":
        return result(base, node, int(rest[0]), float(rest[1]))
    return follow(base, node, int(rest[0]), keep_following=rest[1] == "1", tail=int(rest[2]),
                  appear=float(rest[3]) if len(rest) > 3 else 0.0)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
