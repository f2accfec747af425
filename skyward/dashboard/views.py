"""What the dashboard's pages show and do, as JSON-ready dicts, through the very functions the
``skyward`` command uses: :func:`skyward.clusters.manage.status` (``skyward status``: what the
nodes say now, asked on their control sockets, which never delays autostop),
:func:`skyward.clusters.jobs.jobs` / ``logs`` / ``cancel`` (``queue``, ``logs``, ``cancel``),
and ``manage.stop`` / ``start`` / ``down``.

Guarantees:

1. Nothing here raises for a state that cannot be read now (a cluster removed mid-request, a
   node that does not answer, SQLite busy past its wait): the answer says so, as
   ``{"error": ...}`` or a node ``"unreachable"``; the server turns it into JSON, never a 500.
2. Nothing a page gets holds a secret: a cluster is its ``status --json`` row (the record keeps
   no image env, no ``--secret``), a node its index and address, a job its queue row. A log is
   what the job printed, as ``skyward logs`` shows it.
3. A node is sampled (CPU %, memory, GPUs where ``nvidia-smi`` exists) only when a page asks:
   its first worker, already running, is asked to look (:mod:`skyward.runtime.nodelook`, with
   the node's part of the job queue, in one ask); nothing on the node keeps sampling when
   nobody looks. A worker of an older skyward is sampled with one short ``sh`` command
   (:data:`SAMPLE`) and its queue read as ``skyward queue`` reads it.
"""

from __future__ import annotations

import contextlib
import json
import shlex
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from skyward.clusters import control, jobs, manage
from skyward.dashboard import costs
from skyward.clusters.state import INIT, UP, ClusterStore, note_preemption
from skyward.errors import SkywardError
from skyward.runtime import nodelook

if TYPE_CHECKING:
    from skyward.clusters.state import ClusterRecord
    from skyward.machine import Instance

__all__ = ["ACTIONS", "LOG_TAIL", "SAMPLE", "act", "cluster", "clusters", "done", "job_log", "parse_sample", "pools", "queues"]

T = TypeVar("T")
#: Bytes of a node's log a job page shows first: its last ones (``skyward logs`` prints it all).
LOG_TAIL = 256 * 1024
#: Seconds a node has to answer a sample before it shows as unreachable.
SAMPLE_TIMEOUT = 10.0
#: Run with ``sh`` on a node whose worker is of an older skyward (it has no look): its CPU
#: counters 0.3 s apart, its memory and, where ``nvidia-smi`` exists, each GPU's utilisation and
#: memory (its documented ``--query-gpu`` CSV); :func:`parse_sample` reads it.
SAMPLE = ("read -r a </proc/stat; sleep 0.3; read -r b </proc/stat; echo \"$a\"; echo \"$b\"; "
          "grep -E '^(MemTotal|MemAvailable):' /proc/meminfo; "
          "if command -v nvidia-smi >/dev/null 2>&1; then echo gpus; "
          f"nvidia-smi {' '.join(nodelook.GPU_QUERY)} 2>/dev/null || echo gpus-failed; fi")


def parse_sample(text: str) -> dict[str, Any]:
    """What :data:`SAMPLE` printed, as the page shows it: ``cpu`` (busy % over the 0.3 s),
    ``memory_used`` and ``memory_total`` (bytes), ``gpus``: per GPU ``util`` (%), ``memory_used``
    and ``memory_total`` (MiB), None where the node has no ``nvidia-smi``, [] where it failed."""
    lines = text.splitlines()
    a, b = ([int(x) for x in line.split()[1:]] for line in lines[:2])
    memory = {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in lines[2:4])}
    gpus: list[dict[str, float]] | None = None
    if "gpus" in lines:
        try:
            gpus = nodelook.gpu_rows("\n".join(lines[lines.index("gpus") + 1:]))
        except ValueError:  # ("gpus-failed", or a message where figures were due)
            gpus = []
    return {"cpu": nodelook.busy(a, b), "memory_used": memory["MemTotal"] - memory["MemAvailable"],
            "memory_total": memory["MemTotal"], "gpus": gpus}


def safely(read: Callable[[], T]) -> T | dict[str, str]:
    """``read()``, or ``{"error": why}`` when the state cannot be read now."""
    try:
        return read()
    except SkywardError as exc:
        return {"error": str(exc)}
    except Exception as exc:  # (sqlite3.OperationalError, OSError, a record gone mid-read...)
        return {"error": f"cannot read it now ({type(exc).__name__}: {exc})"}


def clusters() -> list[dict[str, Any]]:
    """Every cluster, as ``skyward status --json`` lists it, with its autostop as the table says it."""
    return [{**s.as_dict(), "autostop": s.record.autostop} for s in manage.status()]


def cluster(name: str) -> dict[str, Any]:
    """Cluster ``name``: its status row, its nodes (sampled when it is up; when it is partly up,
    INIT, those whose workers answer, the others ``lost``) and its job queue."""
    found = manage.status([name])
    if not found:
        return {"error": f"no cluster named {name}", "gone": True, "events": _events(name)}
    shown = found[0]
    record = shown.record
    samples: list[dict[str, Any]] = [{} for _ in record.instances]
    answering = _answering(record) if shown.status == INIT and record.workers else None
    if shown.status == UP or answering is not None:
        with ThreadPoolExecutor(max(1, len(record.instances))) as pool:
            samples = list(pool.map(lambda inst: _look(record, inst) if answering is None or answering[inst.node]
                                    else {"state": "lost", "why": "its worker does not answer"}, record.instances))
    rows = [sample.pop("rows", None) for sample in samples]
    for inst, sample in zip(record.instances, samples, strict=True):  # (the spot notices each node heard)
        for n in sample.pop("notices", []):
            note_preemption(name, inst.node, n["kind"], n["action"], n["at"], n.get("heard"))
    nodes = [{"node": inst.node, "host": inst.ssh.host if inst.ssh else "this machine",
              "price_per_hour": inst.price_per_hour, **sample} for inst, sample in zip(record.instances, samples,
                                                                                       strict=True)]
    queue: Any = []
    if shown.status == UP:  # (every node said its part of the queue with its look: nothing more to ask)
        parts = [r for r in rows if r is not None]
        queue = safely(lambda: _newest_first(record, jobs.merged(parts) if len(parts) == len(rows) else None))
    return {**shown.as_dict(), "autostop": record.autostop, "nodes": nodes, "jobs": queue, "events": _events(name)}


def _events(name: str) -> list[dict[str, Any]]:
    """Cluster ``name``'s timeline, newest first (nothing: it cannot be read now)."""
    found = safely(lambda: ClusterStore().events(name))
    return [e.as_dict() for e in reversed(found)] if isinstance(found, list) else []


def _answering(record: ClusterRecord) -> dict[int, bool] | None:
    """(A cluster partly up) Whether each node's workers all answer on their control sockets;
    None when the nodes cannot be asked now."""
    try:
        answers = manage.ask_workers(record, "status")
    except (ConnectionError, OSError):
        return None
    per = record.processes
    return {inst.node: all(a == "up" for a in answers[inst.node * per:(inst.node + 1) * per])
            for inst in record.instances}


def _newest_first(record: ClusterRecord, known: list[jobs.JobRow] | None = None) -> list[dict[str, Any]]:
    """The cluster's jobs (``known``, else asked of its nodes), newest first, each with its cost:
    the cluster's price for as long as it ran (None: no price known)."""
    return [{**j.as_dict(), "cost": costs.job_cost(record, j.started, j.ended)}
            for j in reversed(jobs.jobs(record.name) if known is None else known)]


def _look(record: ClusterRecord, inst: Instance) -> dict[str, Any]:
    """Node ``inst`` as its first worker sees it (:mod:`skyward.runtime.nodelook`), with its part
    of the job queue (``rows``); a worker of an older skyward, which has no look, is sampled
    with :data:`SAMPLE` instead (and gives no ``rows``)."""
    from skyward.transport import reach

    try:
        transport = reach(inst)
        try:
            said = control.ask_node(transport, record.pythons[inst.node],
                                    [(f"look {inst.node}", record.socket(inst.node * record.processes))])[0]
        finally:
            with contextlib.suppress(Exception):
                transport.close()
    except Exception as exc:
        return {"state": "unreachable", "why": f"{type(exc).__name__}: {exc}"[:300]}
    if said in ("error", "old"):
        return _sample(inst)
    if not said.startswith("{"):
        return {"state": "unreachable", "why": f"its worker does not answer ({said})"}
    found = json.loads(said)
    if "error" in found:
        return {"state": "unreachable", "why": f"its worker could not read the node: {found['error']}"}
    return {"state": "up", **found}


def _sample(inst: Instance) -> dict[str, Any]:
    from skyward.transport import reach

    try:
        transport = reach(inst)
        try:
            result = transport.run(shlex.join(["sh", "-c", SAMPLE]), timeout=SAMPLE_TIMEOUT)
        finally:
            with contextlib.suppress(Exception):
                transport.close()
        if result.exit_code != 0:
            return {"state": "unreachable", "why": f"the sample exited {result.exit_code}"}
        return {"state": "up", **parse_sample(result.stdout)}
    except Exception as exc:
        return {"state": "unreachable", "why": f"{type(exc).__name__}: {exc}"[:300]}


def pools() -> list[dict[str, Any]]:
    """The pools of running scripts that opted in (``ComputePool(dashboard=True)``), as their
    snapshots say (:mod:`skyward.console.snapshot`): nodes, tasks, tasks per second."""
    from skyward.console import snapshot

    return snapshot.live()


def queues() -> list[dict[str, Any]]:
    """Every cluster's jobs, newest first, as ``skyward queue -a --json`` lists them; a cluster
    whose queue cannot be read now has an ``error`` instead."""
    out = []
    for record in ClusterStore().all():
        listed = safely(partial(_newest_first, record))
        out.append({"cluster": record.name, "status": record.status,
                    **({"jobs": listed} if isinstance(listed, list) else {"jobs": [], **listed})})
    return out


def job_log(name: str, job_id: int, seen: dict[int, int]) -> dict[str, Any]:
    """Job ``job_id``'s lines after byte ``seen[node]`` of each node's log (what the page has
    shown; a node not seen yet: from its last :data:`LOG_TAIL` bytes, ``skipped`` saying where
    it starts when that is not the log's start), the offsets after them (the page sends them back
    with its next ask) and the job's row (None: no such job). Each node reads only those bytes."""
    found = jobs.job(name, job_id)
    if found is None:
        return {"error": f"no job {job_id} on cluster {name}", "job": None}
    parts = jobs.log_since(name, job_id, seen, tail=LOG_TAIL)
    lines = [{"node": node, "text": text} for node in sorted(parts) for text in parts[node][0]]
    skipped = [n for n in sorted(parts) if n not in seen and parts[n][2]]
    note = (f"showing the last {LOG_TAIL // 1024} KiB of the log of node{'s' * (len(skipped) > 1)} "
            f"{', '.join(map(str, skipped))}; `skyward logs {name} {job_id}` prints it all") if skipped else None
    return {"job": found.as_dict(), "lines": lines, "seen": {str(n): parts[n][1] for n in sorted(parts)},
            "skipped": {str(n): parts[n][2] for n in skipped}, "note": note}


def _start(name: str) -> list[str]:
    manage.start(name, console=False)  # (raises when it cannot start)
    return []


def _cancel(name: str, job_id: int) -> list[str]:
    cancelled, problems = jobs.cancel(name, [job_id])
    return problems if cancelled or problems else [f"job {job_id} was not cancelled (it had ended)"]


#: What a page may ask of a cluster (every one a POST): the name of the action -> what it does,
#: returning the problems (nothing: done and confirmed).
ACTIONS: dict[str, Callable[..., list[str]]] = {
    "stop": manage.stop,
    "down": manage.down,
    "start": _start,
    "cancel": _cancel,
}


def act(action: str, name: str, *args: int) -> dict[str, Any]:
    """Do ``action`` to cluster ``name``; ``{"done": True}`` or ``{"error": why}``."""
    return done(f"{action} {name}", safely(lambda: ACTIONS[action](name, *args)))


def done(what: str, result: list[str] | dict[str, str]) -> dict[str, Any]:
    """An action's answer: ``{"done": True}``, or ``{"error": why}`` naming ``what`` was asked."""
    if isinstance(result, dict):
        return result
    if result:
        return {"error": f"{what}: not confirmed: " + "; ".join(result)}
    return {"done": True}
