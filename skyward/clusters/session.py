"""One client's use of a named cluster: resolve the name, hold the cluster, attach or create,
then detach or end it. :class:`~skyward.ComputePool` delegates here when given ``name=``.

States a record goes through (``skyward status`` shows them)::

    (none) --create--> INIT --workers ready--> UP --autostop (AWS: machines stopped)--> STOPPED
                                                ^                                        |
                                                +------- attach / skyward start ---------+
    any --pool.down() / skyward down--> (none)

Every exit path leaves the cluster UP and attachable, or gone: a failure while creating ends
whatever was started and forgets the record; a failure while attaching touches nothing that
was running (workers found dead are started again, on the same machines).
"""

from __future__ import annotations

import contextlib
import math
import sys
import uuid
from typing import TYPE_CHECKING, Any

from skyward import events as ev
from skyward.clusters import spawned
from skyward.clusters.nodes import ClusterNodes, NotRunning
from skyward.clusters.state import (INIT, STOPPED, UP, ClusterRecord, ClusterStore, check_name, hold, note,
                                    note_preemption)
from skyward.errors import ClusterError, ConfigError

if TYPE_CHECKING:
    from skyward.compute import PendingCompute
    from skyward.image import Image
    from skyward.pool.pool import ComputePool
    from skyward.transport import Transport

__all__ = ["ClusterSession", "open_named", "resolve"]

#: The shape fields a later pool must agree on, as (ComputePool parameter, record attribute).
SHAPE = (("provider", "provider"), ("nodes", "nodes"), ("accelerator", "accelerator"),
         ("processes_per_node", "processes"))


def resolve(name: object, given: dict[str, Any]) -> tuple[ClusterRecord | None, dict[str, Any]]:
    """The cluster ``name``'s record (None if there is none) and ``given`` (the pool's shape
    arguments, None where not given) with the record's values filled in. Raises ClusterError
    for a shape that disagrees with the record's, or for a bare name that names no cluster."""
    name = check_name(name)
    record = ClusterStore().get(name)
    filled = dict(given)
    if record is None:
        if all(given.get(k) is None for k in ("provider", "nodes", "accelerator")):
            raise ClusterError(name, "no cluster by this name", way_out="create it by giving its shape "
                               f"(sky.ComputePool(name={name!r}, nodes=...), or `skyward launch -c {name} TASK.yaml`); "
                               "`skyward status` lists the clusters")
        return None, filled
    check_shape(record, given)
    for param, attr in SHAPE:
        if filled.get(param) is None:
            filled[param] = getattr(record, attr)
    return record, filled


def open_named(name: str | None, idle_minutes: object, down: object,
               shape: dict[str, Any]) -> tuple[ClusterSession | None, dict[str, Any]]:
    """``ComputePool(name=..., idle_minutes=..., down=...)``'s arguments checked before anything
    starts: the session that will hold the cluster (None for an unnamed pool) and the shape with
    the cluster's own values where the pool left them out."""
    idle = check_autostop(name, idle_minutes, down)
    if name is None:
        return None, shape
    _, filled = resolve(name, shape)
    return ClusterSession(name, idle, down is True), filled


def check_shape(record: ClusterRecord, given: dict[str, Any]) -> None:
    for param, attr in SHAPE:
        wanted = given.get(param)
        if wanted is None:
            continue
        have = getattr(record, attr)
        if param == "provider":
            same = type(wanted) is type(have) and repr(wanted) == repr(have)
            wanted, have = repr(wanted), repr(have)
        elif param == "accelerator":
            same = str(wanted) == str(have)
            wanted = str(wanted)
        else:
            same = wanted == have
        if not same:
            raise ClusterError(record.name, f"{param}={wanted!r} was asked, but the cluster has {param}={have!r}",
                               field=param, wanted=wanted, have=have,
                               way_out=f"leave {param} out to use the cluster as it is, or end it first with "
                                       f"`skyward down {record.name}`")


def check_autostop(name: str | None, idle_minutes: object, down: object) -> float | None:
    """The cluster's autostop in minutes (None: none). ``down`` alone (SkyPilot's ``--down``) is
    0 idle minutes and a teardown: the cluster ends once no client is attached and no detached
    run goes on; with ``idle_minutes`` it ends after that many idle minutes."""
    if idle_minutes is not None:
        if name is None:
            raise ConfigError("idle_minutes", "None for an unnamed pool (autostop is for named clusters: "
                              "give name=...)", idle_minutes, detail="an unnamed pool ends with its `with` block")
        if isinstance(idle_minutes, bool) or not isinstance(idle_minutes, (int, float)) \
                or not 0 <= idle_minutes < math.inf:
            raise ConfigError("idle_minutes", "a number of minutes >= 0 (fractions allowed: 0.5 is 30 s; 0: as soon "
                              "as no client is attached), or None", idle_minutes)
    if not isinstance(down, bool):
        raise ConfigError("down", "True or False", down)
    if down and name is None:
        raise ConfigError("down", "False for an unnamed pool (down is for named clusters: give name=...)", down,
                          detail="an unnamed pool ends with its `with` block")
    if idle_minutes is None:
        return 0.0 if down else None
    return float(idle_minutes)


class ClusterSession:
    """The pool's side of a named cluster, from ``__enter__`` to ``__exit__``."""

    def __init__(self, name: str, idle_minutes: float | None, down: bool):
        self.name = name
        self.idle_minutes = idle_minutes
        self.down_on_idle = down
        self.store = ClusterStore()
        self._lock = contextlib.ExitStack()
        self.record: ClusterRecord | None = None
        self.created = False
        self.attached = False  # whether this client reached running workers (vs started them)

    def open(self, pool: ComputePool, image: Image) -> None:
        """Hold the cluster, then attach to its workers or create it; the pool's nodes are
        ready afterwards. On failure, whatever this call started is ended."""
        self._lock.enter_context(hold(self.name))
        pool.subscribe(self._heard)  # (from the start: a notice heard before is told at the attach)
        record = self.store.get(self.name)
        if record is not None:
            check_shape(record, {"provider": pool.provider, "nodes": pool.nodes, "accelerator": pool.accelerator,
                                 "processes_per_node": pool.processes_per_node})
        heartbeat = (pool.heartbeat_interval, pool.idle_timeout)
        if record is None:
            self._create(pool, image, image.content_hash(), heartbeat)
            return
        changes: dict[str, Any] = {}
        if self.idle_minutes is not None:
            changes.update(idle_minutes=self.idle_minutes, down=self.down_on_idle)
        self.record = record = record.with_(**changes)
        pool.task_id = record.task_id or pool.task_id
        if not pool._image_given:  # attach to the cluster as it is; new workers get its last image
            image = record.image if record.image is not None else image
        image_hash = image.content_hash() if pool._image_given else record.image_hash
        nodes = self._nodes(pool, record)
        if not record.instances:
            # Its creation never got its machines (that client was killed): clear what it may
            # have left (a cloud pool's tagged resources), then create it afresh.
            problems = nodes.down()
            if problems:
                raise ClusterError(self.name, "a creation that did not finish left resources that could not be "
                                   "released: " + "; ".join(problems), way_out=f"`skyward down {self.name}`")
            self.store.remove(self.name)
            self._create(pool, image, image.content_hash(), heartbeat)
            return
        if record.status == UP and not _machines_running(record):
            record = record.with_(status=STOPPED)  # (AWS: autostop powered them off, stopped)
        if record.status == UP and record.image_hash == image_hash:
            try:
                nodes.attach(pool.start_timeout, heartbeat, image)
                self.attached = True
                self._save(record.with_(status=UP), event=("attach", f"a client attached ({_client()})"))
                return
            except NotRunning:
                pass
        # The workers are gone (autostop), or the image changed: end what is left of them and
        # start new ones on the cluster's machines (their environments are kept, so warm).
        if record.status != UP:
            record = self._start_machines(record)  # (first: a stopped cloud machine is not reachable)
            nodes = self._nodes(pool, record)
        nodes.down(release=False)
        nodes = self._nodes(pool, record)
        why = "it was stopped" if record.status != UP else (
            "its image changed" if record.image_hash != image_hash else "its workers were gone (autostop ended them)")
        nodes.start_workers(image, pool.start_timeout, heartbeat, provision=False)
        self._save(self._ready(record, nodes, image.content_hash(), image))
        note(self.name, "start", f"started: new workers on its {record.nodes} node(s), as {why} ({_client()})")

    def _heard(self, event: ev.Event) -> None:
        """A spot notice a node heard goes on the cluster's timeline at once (one heard before the
        attach, at the attach), at the time the node heard it."""
        if isinstance(event, ev.NodePreempting):
            note_preemption(self.name, event.node, event.kind, event.action, event.at.timestamp(),
                            event.heard.timestamp() if event.heard is not None else None)

    def _create(self, pool: ComputePool, image: Image, image_hash: str, heartbeat: tuple[float, float]) -> None:
        record = ClusterRecord(
            name=self.name, id=uuid.uuid4().hex[:10], provider=pool.provider, provider_name=pool.provider.name,
            nodes=pool.nodes, processes=pool.processes_per_node, concurrency=pool.concurrency,
            executor=pool.executor, accelerator=str(pool.accelerator) if pool.accelerator is not None else None,
            idle_minutes=self.idle_minutes, down=self.down_on_idle, task_id=pool.task_id, status=INIT,
            image_hash=image_hash, pool_id=pool.id)
        self._save(record)  # INIT: a client killed from here on leaves a record `skyward down` ends
        self.created = True
        nodes = self._nodes(pool, record)
        nodes.start_workers(image, pool.start_timeout, heartbeat, provision=True)
        ready = self._ready(record, nodes, image_hash, image)
        self._save(ready)
        note(self.name, "launch", f"launched on {ready.provider_name}: {ready.resources} ({_client()})")
        for inst in ready.instances:
            price = "" if inst.price_per_hour is None else f", ${inst.price_per_hour:g}/h"
            note(self.name, "node", f"node {inst.node} added at launch: {_where(inst)}"
                                    f"{' (spot)' if inst.spot else ''}{price}")

    def _nodes(self, pool: ComputePool, record: ClusterRecord) -> ClusterNodes:
        nodes = pool._make_nodes(ClusterNodes, record=record)
        pool._nodes = nodes
        return nodes

    def _ready(self, record: ClusterRecord, nodes: ClusterNodes, image_hash: str, image: Image) -> ClusterRecord:
        pythons = [""] * len(nodes.instances)
        roots = [""] * len(nodes.instances)
        for inst, transport, launch in zip(nodes.instances, nodes._transports, nodes._launches, strict=True):
            pythons[inst.node] = transport.expand(launch.python)
            roots[inst.node] = nodes.root(inst, transport)
        pids = [c.pid or 0 for c in nodes.connections]
        prices = [inst.price_per_hour for inst in nodes.instances if inst.price_per_hour is not None]
        price = sum(prices) if len(prices) == len(nodes.instances) else None  # (all its machines' prices known)
        return record.with_(instances=tuple(nodes.instances), pythons=tuple(pythons), roots=tuple(roots),
                            workers=tuple(zip(pids, nodes.trees, strict=True)), image_hash=image_hash, status=UP,
                            image=_storable(image), price_per_hour=price)

    def _start_machines(self, record: ClusterRecord) -> ClusterRecord:
        start = getattr(record.provider, "start", None)
        if start is None:  # Local and SSH: the machines never stopped, only the workers did
            return record
        return record.with_(instances=tuple(start(list(record.instances))), status=INIT)

    def spawn(self, pool: ComputePool, pending: PendingCompute[Any], broadcast: bool) -> spawned.Job[Any]:
        return spawned.spawn(pool, pending, broadcast)

    def job(self, job: object) -> spawned.Job[Any]:
        return spawned.find(self.name, job)

    def jobs(self) -> list[spawned.Job[Any]]:
        return spawned.listed(self.name)

    def _save(self, record: ClusterRecord, event: tuple[str, str] | None = None) -> None:
        self.record = record
        self.store.put(record, event)

    def keep_connections(self, pool: ComputePool) -> dict[int, Transport]:
        """The nodes' connections, left open when the pool detaches (see
        :meth:`ClusterNodes.keep_connections`); the caller closes them."""
        nodes = pool._nodes
        return nodes.keep_connections() if isinstance(nodes, ClusterNodes) else {}

    def close(self, pool: ComputePool, *, down: bool, failed: bool) -> list[str]:
        """Detach (the cluster stays UP), or end it (``down``, or a creation that failed)."""
        problems: list[str] = []
        nodes = pool._nodes
        try:
            if not self._lock._exit_callbacks:  # never held: nothing of ours to touch
                return problems
            if down or (failed and self.created):
                problems = nodes.down() if isinstance(nodes, ClusterNodes) else []
                if not problems:
                    self.store.remove(self.name)
                    note(self.name, "down", ("ended by its client" if down else "its creation failed: ended")
                         + f" ({_client()})", self.record)
                elif self.record is not None:
                    self._save(self.record.with_(status=INIT))
            elif failed and isinstance(nodes, ClusterNodes) and nodes.spawn_residents:
                # new workers for an existing cluster did not all start: end those that did
                problems = nodes.down(release=False)
                if self.record is not None:
                    self._save(self.record.with_(status=STOPPED, workers=()))
            elif isinstance(nodes, ClusterNodes) and nodes.connections:
                problems = nodes.detach()
                note(self.name, "detach", f"the client detached ({_client()})" + (
                    f"; {'; '.join(problems)}" if problems else ""))
                if pool._console_attached and not failed:
                    print(f"skyward: detached from cluster {self.name!r}; {_autostop_text(self.name, self.record)}",
                          file=sys.stderr)
        finally:
            self._lock.close()
        return problems

def _client() -> str:
    import os
    import socket

    return f"pid {os.getpid()} on {socket.gethostname()}"


def _where(inst: Any) -> str:
    return inst.ssh.host if inst.ssh is not None else "this machine"


def _storable(image: Image) -> Image | None:
    """The image as the record keeps it (to start new workers later): without its secret env
    values; not at all if it holds other secrets (credentials in an index URL)."""
    secret = set(image.secrets())
    kept = {k: v for k, v in image.env.items() if v not in secret}
    stripped = type(image)(**{**_fields(image), "env": kept})
    return None if stripped.secrets() else stripped


def _fields(image: Image) -> dict[str, Any]:
    import dataclasses

    return {f.name: getattr(image, f.name) for f in dataclasses.fields(image) if f.init}


def _machines_running(record: ClusterRecord) -> bool:
    """Whether the cloud says every machine of the cluster runs (True where it cannot say)."""
    states = getattr(record.provider, "machine_states", None)
    return states is None or set(states(list(record.instances))) == {"running"}


def _autostop_text(name: str, record: ClusterRecord | None) -> str:
    if record is not None and record.idle_minutes == 0 and record.down:
        return "it ends once no job is left in its queue (down)"
    if record is None or record.idle_minutes is None:
        stays = "no autostop"
    else:
        stays = f"autostop after {record.idle_minutes:g} min idle" + (", then down" if record.down else "")
    return f"it stays up ({stays}); end it with `skyward down {name}`"
