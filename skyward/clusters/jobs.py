"""A cluster's job queue from any client: list, follow, cancel (``skyward queue``, ``logs``,
``cancel``), without attaching to the cluster (a client that holds it is not disturbed).

The queue lives on the nodes (:mod:`skyward.runtime.jobqueue`); each node is asked over its
transport, with the node's own Python running that module as a script, and the answers are put
together here: a job is PENDING until it starts on a node, RUNNING while it runs on any node,
and once it has ended on every node the first of :data:`ENDINGS` a node reached (its exit code
the first failing node's), SUCCEEDED otherwise.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from skyward.errors import ClusterError, ConfigError
from skyward.runtime.jobqueue import (ACTIVE, CANCELLED, FAILED, FAILED_DRIVER, FAILED_SETUP, PENDING, RUNNING,
                                      SETTING_UP, SUCCEEDED, TOOL)

if TYPE_CHECKING:
    from skyward.clusters.state import ClusterRecord
    from skyward.providers.base import Instance
    from skyward.transport import Transport

__all__ = ["LOG_CHUNK", "JobRow", "cancel", "cluster_record", "each_node", "follow_job", "jobs", "log_since", "logs",
           "merged", "run_tool"]

#: ``skyward logs --status``'s exit codes (SkyPilot's), also those of a ``launch -c``/``exec``
#: that followed its job to the end.
STATUS_CODES = {SUCCEEDED: 0, FAILED: 100, FAILED_SETUP: 100, FAILED_DRIVER: 100, CANCELLED: 103}
#: How a job that ended ended, from the nodes' parts: the first of these any node reached (a
#: setup that failed on one node ends the others' parts: FAILED_SETUP wins over their CANCELLED).
ENDINGS = (FAILED_SETUP, CANCELLED, FAILED_DRIVER, FAILED)
NOT_FINISHED, NO_SUCH_JOB = 101, 102
#: Bytes of a node's log that :func:`log_since` sends at most (the rest comes with the next ask).
LOG_CHUNK = 1_000_000
#: Seconds a follower started as its job is being queued waits for the job's part on its node.
APPEAR = 60.0


@dataclass(frozen=True)
class JobRow:
    """One job of a cluster, every node's part put together."""

    id: int
    name: str
    submitted: float
    started: float | None
    ended: float | None
    resources: str
    status: str
    exit_code: int | None

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "submitted": self.submitted, "started": self.started,
                "ended": self.ended, "resources": self.resources, "status": self.status, "exit_code": self.exit_code}


def cluster_record(name: str) -> ClusterRecord:
    from skyward.clusters.manage import _record as record

    return record(name)


def _tool(record: ClusterRecord, node: int, *args: str) -> str:
    """The shell command that runs the queue's script on node ``node`` (exit 102: no queue yet)."""
    base = f"{record.roots[node]}/c/{record.id}"
    path = shlex.quote(f"{base}/{TOOL}")
    # (read once: a file being written as a follower starts, with its job, reads empty, and says 102)
    return (f"t=$(cat {path} 2>/dev/null); [ -n \"$t\" ] || exit 102; exec {shlex.quote(record.pythons[node])} -I -S "
            "\"$t\" " + shlex.join([base, str(node), *args]))


def each_node(record: ClusterRecord, work: Callable[[Instance], None]) -> None:
    """``work(instance)`` for every node at once (one thread each); the first error is raised."""
    errors: list[BaseException] = []

    def one(inst: Instance) -> None:
        try:
            work(inst)
        except BaseException as exc:  # (raised below, in the caller's thread)
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(inst,), daemon=True) for inst in record.instances]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def run_tool(record: ClusterRecord, inst: Instance, *args: str, accept: tuple[int, ...] = (0, 102)) -> tuple[int, str]:
    """Run the queue's tool with ``args`` on ``inst``: (exit code, stdout); ClusterError when the
    node cannot be reached or the exit code is not in ``accept``. What only reads (``rows``,
    ``read``) on a node that is this machine, whose tool is this skyward's, is answered here by
    the same code, with no process (the dashboard asks it every second of every node)."""
    from skyward.runtime import jobtool
    from skyward.transport import reach

    if args[0] in jobtool.READS and _tool_here(record, inst) == os.path.realpath(jobtool.__file__):
        try:
            code, out = jobtool.answer(f"{record.roots[inst.node]}/c/{record.id}", inst.node, args[0], list(args[1:]))
        except Exception as exc:  # (sqlite3.OperationalError, OSError...)
            raise ClusterError(record.name, f"node {inst.node} could not read its job queue ({exc})",
                               way_out="see `skyward status`") from exc
    else:
        transport = reach(inst)
        try:
            result = transport.run(_tool(record, inst.node, *args), timeout=60.0)
        except Exception as exc:
            raise ClusterError(record.name, f"cannot reach node {inst.node} ({exc})",
                               way_out="see `skyward status`") from exc
        finally:
            with contextlib.suppress(Exception):
                transport.close()
        code, out = result.exit_code, result.stdout
        if code not in accept:
            raise ClusterError(record.name, f"node {inst.node} could not read its job queue (exit {code}: "
                               f"{result.stderr.strip()[-500:]})", way_out="see `skyward status`")
    return code, out


def _tool_here(record: ClusterRecord, inst: Instance) -> str | None:
    """The path of the tool node ``inst`` runs when the node is this machine (no SSH, no
    launcher), else None."""
    if inst.ssh is not None or inst.launcher:
        return None
    try:
        with open(f"{record.roots[inst.node]}/c/{record.id}/{TOOL}") as f:
            return os.path.realpath(f.read().strip())
    except OSError:
        return None


def jobs(name: str) -> list[JobRow]:
    """Cluster ``name``'s jobs, oldest first."""
    record = cluster_record(name)
    nodes: list[list[dict[str, Any]]] = []
    lock = threading.Lock()

    def ask(inst: Instance) -> None:
        code, out = run_tool(record, inst, "rows")
        found = json.loads(out) if code == 0 else []
        with lock:
            nodes.append(found)

    each_node(record, ask)
    return merged(nodes)


def merged(nodes: list[list[dict[str, Any]]]) -> list[JobRow]:
    """The cluster's jobs, oldest first, from every node's part of them (what each node's queue
    says of its part: :func:`skyward.runtime.jobtool.rows`)."""
    parts: dict[int, list[dict[str, Any]]] = {}
    for found in nodes:
        for row in found:
            parts.setdefault(row["id"], []).append(row)
    return [_merge(rows) for _, rows in sorted(parts.items())]


def _merge(rows: list[dict[str, Any]]) -> JobRow:
    # (the nodes beyond a job of fewer nodes than its cluster end their part at once: not its state)
    rows = [r for r in rows if r["node"] < (r["nodes"] or 1)] or rows
    states = {r["status"] for r in rows}
    first = rows[0]
    if states & set(ACTIVE) or len(rows) < (first["nodes"] or 1):
        status = RUNNING if RUNNING in states else SETTING_UP if SETTING_UP in states else PENDING
        if status == PENDING and states - {PENDING}:  # (some nodes ended, others wait: still not finished)
            status = RUNNING
    else:
        status = next((s for s in ENDINGS if s in states), SUCCEEDED)
    codes = [r["exit_code"] for r in sorted(rows, key=lambda r: r["node"]) if r["exit_code"] is not None]
    started = [r["started"] for r in rows if r["started"]]
    ended = [r["ended"] for r in rows if r["ended"]]
    return JobRow(first["id"], first["name"], first["submitted"], min(started) if started else None,
               max(ended) if ended and status not in ACTIVE else None, first["resources"], status,
               next((c for c in codes if c), codes[0] if codes else None))


def job(name: str, job_id: int | None) -> JobRow | None:
    """Job ``job_id`` of cluster ``name`` (the latest when None); None when there is none."""
    found = jobs(name)
    if job_id is None:
        return found[-1] if found else None
    return next((j for j in found if j.id == job_id), None)


def cancel(name: str, ids: list[int] | None) -> tuple[list[int], list[str]]:
    """Cancel jobs ``ids`` of cluster ``name`` (None: every job not finished) on every node; returns
    the jobs cancelled and what could not be confirmed (processes left, per node)."""
    record = cluster_record(name)
    if ids is not None:
        known = {j.id: j for j in jobs(name)}
        for i in ids:
            if i not in known:
                raise ConfigError("ID", f"a job of cluster {name} ({_ids(known)})", i)
            if known[i].status not in ACTIVE:
                raise ConfigError("ID", f"a job of cluster {name} that has not finished (job {i} is "
                                        f"{known[i].status})", i)
    cancelled: set[int] = set()
    problems: list[str] = []
    lock = threading.Lock()

    def one(inst: Instance) -> None:
        code, out = run_tool(record, inst, "cancel", *(["all"] if ids is None else [str(i) for i in ids]))
        done = json.loads(out) if code == 0 else {"cancelled": [], "left": []}
        with lock:
            cancelled.update(done["cancelled"])
            if done["left"]:
                problems.append(f"node {inst.node}: processes {done['left']} still alive")

    each_node(record, one)
    return sorted(cancelled), problems


def _ids(known: dict[int, JobRow]) -> str:
    return "jobs " + ", ".join(str(i) for i in sorted(known)) if known else "it has no jobs"


def logs(name: str, job_id: int, out: IO[str], *, follow: bool = True, tail: int = -1,
         on_end: Callable[[int, str], None] | None = None,
         transports: Mapping[int, Transport] | None = None,
         queued: threading.Event | None = None) -> dict[int, tuple[str, int | None]]:
    """Write job ``job_id``'s output, every node's lines as ``[node N] ...``; with ``follow``,
    until it has ended on every node (``on_end(node, state)`` as each node's part ends). Returns
    how it ended on each node that said so (with ``follow``): node -> (state, exit code).
    ``transports`` (by node number) are open connections to ask the nodes over (the caller's:
    left open); a node without one gets a connection of its own. ``queued``: the job is being
    queued, set once it is: each node's follower starts meanwhile and waits for its part
    (:data:`APPEAR` seconds at most); one that found none (a node whose tool is older, or had
    no queue yet) is started again once ``queued`` is set; no line is written before."""
    from skyward.runtime.jobtool import END_MARK

    record = cluster_record(name)
    lock = threading.Lock()
    ends: dict[int, tuple[str, int | None]] = {}

    def one(inst: Instance) -> None:
        from skyward.transport import reach

        def line(stream: str, text: str) -> None:
            if queued is not None:
                queued.wait()
            with lock:
                if stream == "stderr" and text.startswith(END_MARK + " "):
                    state, code = text.split()[1:3]
                    ends[inst.node] = (state, None if code == "-" else int(code))
                    if on_end is not None:
                        on_end(inst.node, state)
                    return
                out.write(f"[node {inst.node}] {text}\n")
                out.flush()

        given = (transports or {}).get(inst.node)
        transport = given or reach(inst)
        asks = ["1" if follow else "0", str(tail)]
        try:
            # (the follower starts nothing: its group, with the stream's dead man's switch, ends as
            # the stream closes; confirming it would cost a round trip per node at every follow's end)
            code = transport.stream(_tool(record, inst.node, "follow", str(job_id), *asks,
                                          *([f"{APPEAR:g}"] if queued is not None else [])), line, confirm_gone=False)
            if code == NO_SUCH_JOB and queued is not None and inst.node not in ends:
                queued.wait()
                transport.stream(_tool(record, inst.node, "follow", str(job_id), *asks), line, confirm_gone=False)
        finally:
            if given is None:
                with contextlib.suppress(Exception):
                    transport.close()

    each_node(record, one)
    return ends


def log_since(name: str, job_id: int, offsets: dict[int, int], limit: int = LOG_CHUNK,
              tail: int | None = None) -> dict[int, tuple[list[str], int, int]]:
    """Job ``job_id``'s lines on each node after byte ``offsets[node]`` of its log (none given:
    from the start, or with ``tail`` from the first line that starts in its last ``tail`` bytes),
    at most ``limit`` bytes of whole lines per node, with the offset after them and the one they
    start at. A node reads only those bytes (its tool's ``read``): an ask costs what is new, not
    the log's size. A node whose tool knows no ``read`` (a cluster launched by an older skyward
    keeps its tool) is asked for its whole log, as ``logs`` does, and it is cut here."""
    record = cluster_record(name)
    lock = threading.Lock()
    found: dict[int, tuple[list[str], int, int]] = {}

    def one(inst: Instance) -> None:
        offset = max(0, offsets[inst.node]) if inst.node in offsets else -tail if tail else 0
        code, out = run_tool(record, inst, "read", f"{job_id}@{offset}", str(limit), accept=(0, 1, 102))
        text, start = "", max(0, offset)
        end = start
        if code == 0:
            answer = json.loads(out)
            text, end, start = answer["text"], answer["offset"], answer.get("start", start)
        elif code == 1:  # (a tool of before `read` fails on `ID@OFFSET` at once)
            code, out = run_tool(record, inst, "follow", str(job_id), "0", "-1")
            whole = out.encode()
            if offset < 0 and (cut := len(whole) + offset) > 0:  # (from the first line in the last bytes)
                start = whole.find(b"\n", cut - 1) + 1 or len(whole)
            data = whole[start:start + limit]
            taken = data[:data.rfind(b"\n") + 1] or data[:limit if len(data) == limit else 0]
            text, end = taken.decode(errors="replace"), start + len(taken)
        with lock:
            found[inst.node] = (text.splitlines(), end, start)

    each_node(record, one)
    return found


def _stop_others(record: ClusterRecord, job_id: int, node: int) -> None:
    """End job ``job_id``'s part on every node but ``node`` (best effort: a node not reached
    keeps its part, which `skyward cancel` ends)."""
    for inst in record.instances:
        if inst.node != node:
            with contextlib.suppress(ClusterError):
                run_tool(record, inst, "cancel", str(job_id))


def follow_job(name: str, job_id: int, out: IO[str], err: IO[str], ended: list[str] | None = None,
               transports: Mapping[int, Transport] | None = None, queued: threading.Event | None = None) -> int:
    """Follow job ``job_id`` until it ends (what ``launch -c``/``exec`` do after submitting); returns
    SkyPilot's code for how it ended (0 succeeded, 100 failed, 103 cancelled; ``ended`` gets the
    state). A setup that fails on one node ends the job's part on the others (as SkyPilot's job
    stops at a failed setup). (How it ended comes with the log: a cluster torn down right after
    its last job, ``--down``, cannot be asked again.)
    ``transports``: open connections to the nodes, and ``queued``, as :func:`logs` takes them."""
    record = cluster_record(name)
    nodes = sorted(inst.node for inst in record.instances)
    stopping: list[threading.Thread] = []

    def on_end(node: int, state: str) -> None:  # (under logs' lock: one stop at most)
        if state == FAILED_SETUP and not stopping:
            stop = threading.Thread(target=_stop_others, args=(record, job_id, node), daemon=True)
            stopping.append(stop)
            stop.start()

    ends = logs(name, job_id, out, on_end=on_end, transports=transports, queued=queued)
    for stop in stopping:
        stop.join()
    if not ends:
        err.write(f"skyward: error: job {job_id} is not in cluster {name}'s queue\n")
        return 1
    silent = [n for n in nodes if n not in ends]
    if silent:
        err.write(f"skyward: error: job {job_id} on cluster {name}: node(s) {silent} did not say how it ended "
                  f"(see `skyward logs {name} {job_id} --status`)\n")
        return 1
    states = {state for state, _ in ends.values()}
    status = next((s for s in ENDINGS if s in states), SUCCEEDED)
    if ended is not None:
        ended.append(status)
    if status == SUCCEEDED:
        return 0
    where = next(((n, c) for n, (s, c) in sorted(ends.items()) if s == status and c), None)
    err.write(f"skyward: job {job_id} on cluster {name}: {status}"
              + (f" (node {where[0]}: exit code {where[1]})" if where else "") + "\n")
    return STATUS_CODES[status]
