"""What ``skyward status``, ``autostop``, ``down``, ``stop`` and ``start`` do to a cluster by name.

:func:`status` reconciles the records with the machines: the state shown is what the nodes
say now (their workers answer on their sockets, or the cloud says the machines are stopped),
never only what was last written. A cluster whose nodes ended by themselves shows as STOPPED,
or disappears when its autostop was a teardown (``down=True``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from skyward.clusters import control
from skyward.clusters.nodes import ClusterNodes
from skyward.clusters.state import INIT, STOPPED, UP, ClusterRecord, ClusterStore, cost_so_far, hold, note
from skyward.errors import ClusterBusy, ClusterError

__all__ = ["ClusterStatus", "autostop", "down", "start", "status", "stop"]

_ANSWERS = ("up", "ok", "old", "error", "down")


@dataclass(frozen=True)
class ClusterStatus:
    """A cluster as ``skyward status`` shows it: the record and what the nodes say now."""

    record: ClusterRecord
    status: str  # UP, STOPPED or INIT
    holder: str | None = None  # "pid N on HOST" when a client is attached

    def as_dict(self) -> dict[str, Any]:
        r = self.record
        return {
            "name": r.name, "provider": r.provider_name, "nodes": r.nodes, "processes_per_node": r.processes,
            "resources": r.resources, "status": self.status, "autostop_minutes": r.idle_minutes,
            "autostop_down": r.down, "launched": r.launched_at, "attached": self.holder,
            "price_per_hour": r.price_per_hour,
            "cost_so_far": cost_so_far(r),
        }


def nodes_for(record: ClusterRecord) -> ClusterNodes:
    """The cluster's nodes, to reach or end them without a pool."""
    from skyward.protocol import dumps_payload
    from skyward.providers.base import PoolSpec

    spec = PoolSpec(record.pool_id or record.id, record.nodes, None, record.concurrency)
    nodes = ClusterNodes(record.provider, spec, record.processes, lambda info: None, dumps_payload([]),
                         lambda event: None, [], 0.0, record=record)
    nodes.instances = list(record.instances)
    return nodes


def live_status(record: ClusterRecord) -> str:
    """UP when every worker answers on its socket, STOPPED when none does, INIT otherwise (being
    created, or partly up). Raises ConnectionError when a node cannot be asked."""
    if not record.instances:
        return INIT
    if not record.workers:  # stopped by `skyward stop` (or never started)
        return STOPPED if record.status == STOPPED else INIT
    machines = getattr(record.provider, "machine_states", None)
    if machines is not None:
        states = set(machines(list(record.instances)))
        if states <= {"stopped", "stopping"}:
            return STOPPED
        if states & {"terminated", "shutting-down", "missing"}:
            return "GONE" if states <= {"terminated", "shutting-down", "missing"} else INIT
    answers = ask_workers(record, "status")
    if answers and all(a == "up" for a in answers):
        return UP
    if all(a == "down" for a in answers):
        return STOPPED
    return INIT


def ask_workers(record: ClusterRecord, line: str) -> list[str]:
    """Ask every worker of the cluster ``line`` on its control socket; their answers by rank
    (``down`` for one that did not answer). Raises ConnectionError when a node cannot be asked."""
    from skyward.transport import reach

    answers: list[str] = []
    for inst in record.instances:
        ranks = range(inst.node * record.processes, (inst.node + 1) * record.processes)
        transport = reach(inst)
        try:
            said = control.ask_node(transport, record.pythons[inst.node], [(line, record.socket(r)) for r in ranks])
        except Exception as exc:
            raise ConnectionError(f"cannot reach node {inst.node} ({getattr(transport, 'host', '?')}): {exc}") from exc
        finally:
            with contextlib.suppress(Exception):
                transport.close()
        words = [w for w in ((a.split() or ["down"])[0] for a in said) if w in _ANSWERS]
        answers += words + ["down"] * (len(ranks) - len(words))
    return answers


def status(names: list[str] | None = None) -> list[ClusterStatus]:
    """Every cluster this machine knows (or those named), reconciled with its nodes."""
    store = ClusterStore()
    found = []
    for record in store.all():
        if names and record.name not in names:
            continue
        holder = _holder(record.name)
        if holder is not None and record.status == UP:
            found.append(ClusterStatus(record, UP, holder))  # a client uses it now: it is up
            continue
        try:
            now = live_status(record) if record.status != INIT or holder is None else INIT
        except ConnectionError:
            now = record.status if record.status != UP else INIT
        if now == "GONE" and not _released(record):
            now = INIT  # (its cloud resources could not be removed now: `skyward down` retries)
        elif now == "GONE" or (now == STOPPED and record.down and record.provider_name != "aws"):
            store.remove(record.name)  # it ended itself (autostop with down)
            note(record.name, "down", "its machines are gone" if now == "GONE" else
                 f"ended itself: autostop after {record.idle_minutes:g} min idle, then down", record)
            continue
        if now != record.status:
            _changed(record, now)
            record = record.with_(status=now)
            store.put(record)
        found.append(ClusterStatus(record, now, holder))
    return found


def _changed(record: ClusterRecord, now: str) -> None:
    """Put a status the nodes show, unlike the record's, on the cluster's timeline, with why."""
    if now == STOPPED and record.status == UP:
        why = (f"autostop after {record.idle_minutes:g} min idle" if record.idle_minutes is not None
               else "every worker ended")
        note(record.name, "autostop" if record.idle_minutes is not None else "stop", f"stopped: {why}")
    elif now == INIT and record.status == UP:
        try:
            answers = ask_workers(record, "status")
        except ConnectionError as exc:
            note(record.name, "node", f"nodes cannot be reached: {exc}")
            return
        per = record.processes
        for inst in record.instances:
            if any(a != "up" for a in answers[inst.node * per:(inst.node + 1) * per]):
                note(record.name, "node", f"node {inst.node} lost: its worker does not answer")
    elif now == UP and record.status == INIT and record.workers:
        note(record.name, "node", "every node answers again")


def _released(record: ClusterRecord) -> bool:
    """Remove what is left of a cluster whose machines are gone (terminated by its autostop with
    down, or by hand): on AWS its key pair and security group. False if that failed."""
    release_pool = getattr(record.provider, "release_pool", None)
    if release_pool is None or not record.pool_id:
        return True
    try:
        release_pool(record.pool_id)
    except Exception:
        return False
    return True


def _holder(name: str) -> str | None:
    try:
        with hold(name, "status"):
            return None
    except ClusterBusy as busy:
        return f"pid {busy.pid} on {busy.host}" if busy.pid is not None else "another process"


def _record(name: str) -> ClusterRecord:
    record = ClusterStore().get(name)
    if record is None:
        raise ClusterError(name, "no cluster by this name", way_out="see `skyward status`")
    return record


def down(name: str) -> list[str]:
    """End cluster ``name``: its workers (confirmed gone) and machines; forget it. Returns the
    problems (the record is kept, as INIT, when teardown could not be confirmed)."""
    with hold(name, "down"):
        record = _record(name)
        problems = nodes_for(record).down()
        if problems:
            ClusterStore().put(record.with_(status=INIT))
            note(name, "down", "`skyward down`: not confirmed: " + "; ".join(problems))
        else:
            ClusterStore().remove(name)
            note(name, "down", "ended by `skyward down`", record)
        return problems


def autostop(name: str, idle_minutes: float | None, down: bool = False) -> list[str]:
    """Set running cluster ``name``'s autostop (``idle_minutes`` None: cancel it): its workers
    take the new limit at once, counting idle time from now, and its record keeps it for the
    next start. Returns the problems (workers that did not take it)."""
    found = status([name])
    if not found:
        raise ClusterError(name, "no cluster by this name", way_out="see `skyward status`")
    record = found[0].record
    if found[0].status != UP:
        raise ClusterError(name, f"is {found[0].status}, not UP: autostop is set on a running cluster",
                           way_out=f"`skyward start {name} -i MIN` starts it with one")
    if down != record.down and getattr(record.provider, "machine_states", None) is not None:
        raise ClusterError(name, f"its machines were launched to {'terminate' if record.down else 'stop'} "
                           "when idle; that cannot be changed on running cloud machines yet",
                           way_out=f"keep {'--down' if record.down else 'no --down'}, or `skyward down {name}` "
                                   "and launch it again")
    store = ClusterStore()
    current = store.get(name) or record
    store.put(current.with_(idle_minutes=idle_minutes, down=down if idle_minutes is not None else False))
    line = "autostop " + ("none" if idle_minutes is None else f"{idle_minutes * 60:g}")
    note(name, "autostop", "autostop cancelled" if idle_minutes is None else
         f"autostop set: after {idle_minutes:g} min idle" + (", then down" if down else ", then stop"))
    try:
        answers = ask_workers(record, line)
    except ConnectionError as exc:
        return [str(exc)]
    return [f"worker {rank}: " + ("runs a skyward from before `skyward autostop`: the new autostop applies from "
                                  "its next start" if word == "old" else f"did not take it ({word})")
            for rank, word in enumerate(answers) if word != "ok"]


def stop(name: str) -> list[str]:
    """Stop cluster ``name``'s workers, and on a cloud its machines (disks kept); ``start`` or
    the next pool that attaches brings it back."""
    with hold(name, "stop"):
        record = _record(name)
        refusal = getattr(record.provider, "stop_refusal", None)
        why = refusal(list(record.instances)) if refusal is not None and record.instances else None
        if why:  # (before the workers are ended: the cluster stays as it is)
            raise ClusterError(name, f"cannot be stopped: {why}", way_out=f"`skyward down {name}` ends it")
        problems = nodes_for(record).down(release=False)
        stop_machines = getattr(record.provider, "stop", None)
        if stop_machines is not None and not problems:
            stop_machines(list(record.instances))
        ClusterStore().put(record.with_(status=STOPPED, workers=()))
        note(name, "stop", "stopped by `skyward stop`" + (f"; {'; '.join(problems)}" if problems else ""))
        return problems


def start(name: str, *, console: bool = True) -> None:
    """Start cluster ``name`` again (machines, then workers, with its last image) and detach."""
    from skyward.pool import ComputePool

    _record(name)
    with ComputePool(name=name, console=console):
        pass
