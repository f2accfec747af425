"""A task file's run on a named cluster (what :mod:`skyward.launch` asks of a cluster): the pool's
arguments, whether setup runs again, and the run put in the cluster's job queue as a job
(:mod:`skyward.runtime.jobqueue`), which goes on without the client."""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import threading
from collections.abc import Callable, Mapping
from typing import IO, TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:
    from skyward.clusters.session import ClusterSession
    from skyward.pool.pool import ComputePool
    from skyward.transport import Transport

__all__ = ["Follow", "JobShape", "SetupBlock", "Workdir", "as_on_cluster", "close_connections", "demand",
           "kept_connections", "pool_args", "run_directory", "run_on", "setup_done",
           "setup_failed", "setup_hash", "setup_needed", "start_following", "submit_job"]


class SetupBlock(Protocol):
    """What decides a cluster's setup (a :class:`~skyward.launch.run.LaunchPlan` has it)."""

    @property
    def setup(self) -> str | None: ...

    @property
    def envs(self) -> Mapping[str, str]: ...

    @property
    def secrets(self) -> Mapping[str, str]: ...


class Workdir(Protocol):
    """A task's workdir, as a run on a cluster needs it (a :class:`~skyward.launch.run.LaunchPlan` has it)."""

    @property
    def workdir(self) -> str | None: ...

    @property
    def workdir_git(self) -> tuple[str, str | None] | None: ...


class JobShape(Protocol):
    """What a job's demand is read from (a :class:`~skyward.launch.run.LaunchPlan` has it)."""

    @property
    def name(self) -> str: ...

    @property
    def accelerator(self) -> str | None: ...

    @property
    def cpus(self) -> str | None: ...

    @property
    def nodes(self) -> int: ...


def setup_hash(plan: SetupBlock) -> str | None:
    """What decides whether a cluster's setup runs again: the setup block and its env."""
    if not plan.setup:
        return None
    text = json.dumps([plan.setup, sorted(plan.envs.items()), sorted(plan.secrets)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def pool_args(cluster: Mapping[str, Any], shape: Mapping[str, Any]) -> dict[str, Any]:
    """The ComputePool arguments for a launch on cluster ``cluster["name"]``: the task's shape
    (checked against an existing cluster's, unless ``shape_given`` is false; its provider only
    when given on the command line),
    or for ``exec`` (no shape given) the name alone."""
    from skyward.clusters.state import ClusterStore

    name = cluster["name"]
    args: dict[str, Any] = {"name": name, "idle_minutes": cluster.get("idle_minutes"),
                            "down": cluster.get("down", False)}
    if cluster.get("attach_only"):
        return args
    record = ClusterStore().get(name)
    args.update(shape)
    if record is not None and not cluster.get("provider_given", True):
        args.pop("provider")
    if record is not None and not cluster.get("shape_given", True):  # (a command, or nothing, on the cluster as it is)
        for key in ("nodes", "accelerator", "processes_per_node"):
            args.pop(key, None)
    if record is not None and isinstance(args.get("nodes"), int) and args["nodes"] < record.nodes:
        args["nodes"] = record.nodes  # a task of fewer nodes runs on the cluster's first ones (run_on)
    return args


def as_on_cluster(p: Any, name: str, *, shape_given: bool) -> Any:
    """Plan ``p`` as it runs on cluster ``name`` when that cluster exists and the command line
    named no provider: on the cluster's own provider and machines (its SSH hosts, in node order),
    on all its nodes unless the task asked a shape of its own; ``p`` itself otherwise (the plan
    is what ``launch`` prints before anything runs)."""
    from dataclasses import replace

    from skyward.clusters.state import ClusterStore

    record = ClusterStore().get(name)
    if record is None:
        return p
    hosts = tuple(f"{i.ssh.user}@{i.ssh.host}" + (f":{i.ssh.port}" if i.ssh.port != 22 else "")
                  if i.ssh is not None else i.public_addr or i.private_addr
                  for i in sorted(record.instances, key=lambda i: i.node))
    nodes = min(p.nodes, record.nodes) if shape_given else record.nodes
    return replace(p, provider=record.provider_name, nodes=nodes, hosts=hosts)


def run_on(pool: ComputePool, nodes: int) -> int | None:
    """How many of a cluster's nodes a task of ``nodes`` nodes runs on: None for all of them,
    else its first ``nodes`` (SkyPilot runs a task on fewer nodes than its cluster has).
    :class:`~skyward.ConfigError` when the task asks for more nodes than the cluster has."""
    if nodes > pool.nodes:
        from skyward.errors import ConfigError

        raise ConfigError("num_nodes", f"at most the {pool.nodes} node(s) of cluster {pool.name!r} (a task runs on "
                          "the cluster's nodes, or on its first ones)", nodes)
    return nodes if nodes < pool.nodes else None


def _session(pool: ComputePool) -> ClusterSession:
    """The cluster session of a pool given ``name=``."""
    if pool.cluster is None:
        from skyward.errors import ConfigError

        raise ConfigError("pool", "a pool on a named cluster (ComputePool(name=...))", pool.name)
    return cast("ClusterSession", pool.cluster)


def kept_connections(pool: ComputePool) -> dict[int, Transport]:
    """The cluster's connections to its nodes, by node number, left open when ``pool`` detaches:
    a run that follows its job's log asks the nodes over them instead of connecting again (a
    new SSH connection per node costs a key exchange and an authentication, ~0.1 s). The caller
    closes them."""
    return _session(pool).keep_connections(pool)


def close_connections(connections: Mapping[int, Transport]) -> None:
    for transport in connections.values():
        with contextlib.suppress(Exception):  # (best effort: nothing is held on them any more)
            transport.close()


def start_following(name: str, job: int, setup_ran: bool, connections: Mapping[int, Transport],
                    err: IO[str], queued: threading.Event | None = None) -> Callable[[], int]:
    """Follow job ``job`` of cluster ``name`` to its end over ``connections`` (the pool's, kept
    open past its detach: :func:`kept_connections`; closed after), in a thread of its own: the
    job's log is read while the pool detaches (the detach confirms each bridge gone, a round
    trip per node, ~0.1 s: the job runs meanwhile). Returns the wait for its end, which gives
    the job's exit status (:func:`skyward.clusters.jobs.follow_job`; raising what the follow
    raised) and forgets a failed setup (``--fast`` runs it again next time) only then, once the
    detach has written the cluster's record. An interrupt of the wait stops following, never
    the job (the caller says so). ``queued``: the job is still being queued (see
    :func:`submit_job`), set once it is (:func:`skyward.clusters.jobs.logs`)."""
    from skyward.clusters.jobs import FAILED_SETUP, follow_job

    ended: list[str] = []
    result: list[int] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(follow_job(name, job, sys.stdout, err, ended, transports=connections, queued=queued))
        except BaseException as exc:  # (raised by the wait, in the caller's thread)
            failure.append(exc)

    thread = threading.Thread(target=run, name=f"skyward-follow-{job}", daemon=True)
    thread.start()

    def wait() -> int:
        # (the connections close here, not as the follow ends: the pool's detach, which may
        # still be confirming its bridges gone over them, is over once the caller waits)
        try:
            thread.join()
        finally:
            close_connections(connections)
        if failure:
            raise failure[0]
        if setup_ran and ended == [FAILED_SETUP]:
            setup_failed(name)
        return result[0]

    return wait


class Follow:
    """The follow of the job a run submits to cluster ``name`` (``exec``, ``launch -c`` without
    ``-d``): :meth:`start` as the job is numbered (:func:`submit_job`'s ``numbered``), over the
    pool's connections kept past its detach; :meth:`queued` once every node has queued it and
    its id is out (the job's lines come after it); :meth:`end` waits for the job's end (0 when
    no follow started); :meth:`close` ends a follow begun, with its connections, on a failure."""

    def __init__(self, name: str, err: IO[str]):
        self.name, self.err = name, err
        self.connections: dict[int, Transport] = {}
        self.wait: Callable[[], int] | None = None
        self.done_queueing = threading.Event()

    def starter(self, pool: ComputePool, setup_ran: bool) -> Callable[[int], None]:
        """:func:`submit_job`'s ``numbered``: starts the follow of the job it numbered."""
        return lambda job: self.start(pool, job, setup_ran)

    def start(self, pool: ComputePool, job: int, setup_ran: bool) -> None:
        self.connections = kept_connections(pool)
        self.wait = start_following(self.name, job, setup_ran, self.connections, self.err, self.done_queueing)

    def queued(self) -> None:
        self.done_queueing.set()

    def end(self) -> int:
        return self.wait() if self.wait is not None else 0

    def close(self) -> None:
        close_connections(self.connections)
        self.done_queueing.set()  # (a follower waiting for it ends: its connection is closed)


def setup_needed(pool: ComputePool, p: SetupBlock) -> bool:
    """Whether a cluster launch runs the setup block: the cluster is new, or the block (with its
    env) changed since it last ran there."""
    session = _session(pool)
    record = session.record
    return record is None or record.setup_hash != setup_hash(p) or not session.attached


def setup_done(pool: ComputePool, p: SetupBlock) -> None:
    from skyward.clusters.state import ClusterStore

    session = _session(pool)
    current = ClusterStore().get(session.name) or session.record  # (a restart may have renamed its workers)
    if current is not None:
        session.record = current.with_(setup_hash=setup_hash(p))
        ClusterStore().put(session.record)


def setup_failed(name: str) -> None:
    """Forget that cluster ``name``'s setup ran (its job ended FAILED_SETUP): ``--fast`` runs it again."""
    from skyward.clusters.state import ClusterStore

    current = ClusterStore().get(name)
    if current is not None:
        ClusterStore().put(current.with_(setup_hash=None))


def run_directory(pool: ComputePool, p: Workdir, synced: str | None) -> str | None:
    """Where a run on a cluster starts: the task's own workdir (``synced``, remembered for the
    runs after it) when it has one, else the last workdir synced to the cluster (SkyPilot's
    runs all start in the cluster's workdir), else ``synced``."""
    from skyward.clusters.state import ClusterStore

    session = _session(pool)
    current = ClusterStore().get(session.name) or session.record
    if p.workdir is None and p.workdir_git is None:
        return current.workdir if current is not None and current.workdir else synced
    if current is not None:
        session.record = current.with_(workdir=synced)
        ClusterStore().put(session.record)
    return synced


def demand(accelerator: str | None, cpus: str | None, nodes: int) -> dict[str, Any]:
    """What a job asks of each node (see :mod:`skyward.runtime.jobqueue`): its accelerators
    (``"L4:2"``), its cpus (``"2"``, ``"2+"``: 2), or :data:`DEFAULT_TASK_CPU_DEMAND` of a CPU."""
    from skyward.launch.taskfile.file import parse_minimum
    from skyward.runtime.jobqueue import DEFAULT_TASK_CPU_DEMAND

    gpus = 0.0
    if accelerator:
        kind, _, count = accelerator.partition(":")
        gpus = float(count or 1)
    minimum = parse_minimum(cpus, "resources.cpus")
    cpu = float(minimum[0]) if minimum else (0.0 if gpus else DEFAULT_TASK_CPU_DEMAND)
    parts = ([f"{accelerator.partition(':')[0]}:{gpus:g}"] if accelerator else []) + ([f"CPU:{cpu:g}"] if cpu else [])
    return {"cpus": cpu, "gpus": gpus, "nodes": nodes, "resources": f"{nodes}x[{', '.join(parts)}]"}


def submit_job(pool: ComputePool, p: JobShape, command: str, env: dict[str, str], cwd: str | None,
               setup: str | None = None, numbered: Callable[[int], None] | None = None) -> int:
    """Put ``command`` in the cluster's job queue (every node runs it, ``setup`` first when given,
    detached from this client: it goes on when the client leaves, inside the cluster worker's
    process tree, so it ends with the cluster); returns the job's id. ``numbered(job)`` is called
    once the head has numbered it, before every node queues it (:meth:`Follow.start`: a follower
    takes tens of milliseconds to start on a node, as long as the queueing takes)."""
    from skyward.compute import compute
    from skyward.runtime.jobqueue import enqueue, new_job

    # (every node gets the job; those beyond a task of fewer nodes end their part at once)
    meta = {"name": p.name, **demand(p.accelerator, p.cpus, run_on(pool, p.nodes) or len(pool.instances) or p.nodes)}
    ids = compute(name="number the job")(new_job)(meta) @ pool
    job = next(i for i in ids if i)
    if numbered is not None:
        numbered(job)
    compute(name=f"queue job {job}")(enqueue)(job, meta, command, env, cwd, setup) @ pool
    return job
