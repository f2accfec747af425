"""A named cluster's machines and workers, as a pool sees them (:class:`ClusterNodes`).

The same lifecycle as an ordinary pool's :class:`~skyward.pool.lifecycle.Nodes` (provision,
prepare, start, handshake, dispatch), with three differences:

* each worker is *resident* (:mod:`skyward.worker.resident`): started detached by a command
  run through the node's transport, it listens on a private Unix socket and outlives the
  client. What the pool connects to is a bridge to that socket, started through the same
  transport as any worker, so dispatch, heartbeats and loss detection are unchanged;
* a pool that finds the cluster's workers running attaches: no provisioning, no preparation
  (unless the image changed), the same worker processes;
* leaving detaches (DETACH: that client's tasks are cancelled, the workers wait for the next
  client), and only :meth:`down` stops the workers (confirmed gone by their tree tag) and
  releases the machines.
"""

from __future__ import annotations

import shlex
import time
import uuid
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from skyward import events as ev
from skyward._procs import TREE_VARIABLE
from skyward._retry import Backoff
from skyward.clusters.steps import start_step, step_command
from skyward.errors import BootstrapError, ClusterError, WorkerLost
from skyward.pool.lifecycle import Nodes
from skyward.pool.starting import each, write_files
from skyward.protocol import Kind
from skyward.providers.base import Instance
from skyward.transport import Transport, WorkerLaunch, reach
from skyward.protocol.bridge import BRIDGE

if TYPE_CHECKING:
    from skyward.clusters.state import ClusterRecord
    from skyward.image import Image
    from skyward.providers.base import Provider

#: Seconds a worker that was asked to stop gets before its tree is killed.
STOP_GRACE = 5.0


class NotRunning(Exception):
    """The cluster's workers are not (all) running: they must be started again."""


class ClusterNodes(Nodes):
    """The nodes of a named cluster (see the module docstring). ``record`` is the cluster's
    :class:`~skyward.clusters.state.ClusterRecord`; ``spawn_residents`` says whether
    :meth:`spawn` starts new workers (True) or attaches to running ones (False)."""

    def __init__(self, *args: Any, record: ClusterRecord, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.record = record
        self.spawn_residents = True
        self.trees: list[str] = []
        self.attached = False
        self.image: Image | None = None  # what new workers run (restart)
        self.kept = False  # the connections outlive the detach (see keep_connections)

    # -- start ---------------------------------------------------------------------------------
    def attach(self, start_timeout: float, heartbeat: tuple[float, float], image: Image | None = None) -> None:
        """Connect to the running workers of the record's instances; NotRunning if any is gone."""
        self.image = image
        self.instances = list(self.record.instances)
        self._transports = [reach(inst) for inst in self.instances]
        self._launches = [WorkerLaunch((), python=self.record.pythons[i.node]) for i in self.instances]
        self.spawn_residents = False
        self._start_heartbeat(heartbeat)
        try:
            self.spawn(start_timeout)
        except WorkerLost as exc:
            # Nothing listens (NO_WORKER), or the worker ended as we came (its autostop fired
            # at that moment): either way it must be started again.
            raise NotRunning(str(exc)) from exc
        self.trees = [tree for _, tree in self.record.workers]
        self.attached = True

    def start_workers(self, image: Image, start_timeout: float, heartbeat: tuple[float, float], *,
                      provision: bool) -> None:
        """Start fresh resident workers: on new machines (``provision``) or on the record's."""
        self.image = image
        if provision:
            for node in range(self.spec.nodes):
                self._emit(ev.NodeStage(node, "provisioning"))
            # (the provider makes machines that outlive this client: AWS stops them on autostop)
            self.instances = self.provider.provision(replace(self.spec, cluster=self.record.name,
                                                             cluster_down=self.record.down))
        else:
            self.instances = list(self.record.instances)
        self._transports = [reach(inst) for inst in self.instances]
        self._launches = self._prepare(image)
        self.spawn_residents = True
        self.trees = []
        self._start_heartbeat(heartbeat)
        self.spawn(start_timeout)
        self.attached = True

    def root(self, inst: Instance, transport: Transport) -> str:
        """Where the node's sockets live (an absolute path on the node)."""
        if self.record.roots and len(self.record.roots) > inst.node and self.record.roots[inst.node]:
            return self.record.roots[inst.node]
        if inst.environment is None:
            from skyward._home import home

            return str(home())
        return transport.expand(inst.environment.root)

    def _open(self, inst: Instance, transport: Transport, launch: WorkerLaunch, local_rank: int) -> Any:
        rank = inst.node * self.processes + local_rank
        sock = f"{self.root(inst, transport)}/c/{self.record.id}/{rank}.sock"
        if self.spawn_residents:
            tree = f"cluster-{self.record.id}-{rank}-{uuid.uuid4().hex[:8]}"
            self.trees.append(tree)
            write_files(inst, transport, launch)
            # A provider whose machines power off when idle (AWS's watchdog) names the file the
            # worker touches to keep its machine up until the cluster's autostop.
            command = resident_command(launch, sock, self.record.idle_minutes, tree,
                                       heartbeat_file=getattr(self.provider, "heartbeat_file", None),
                                       in_step=bool(inst.launcher))
            if inst.launcher:  # a batch scheduler's node: the worker is a job step (clusters.steps)
                start_step(inst, step_command(command, getattr(self.provider, "autostop_release", None)), sock)
            else:
                result = transport.run(command, timeout=90.0)
                if not result.ok:
                    raise BootstrapError(transport.host, "starting worker",
                                         f"the cluster's worker did not start (exit code {result.exit_code})",
                                         node=inst.node, log_tail=(result.stdout + result.stderr).splitlines()[-20:])
        return transport.start(bridge(transport, launch, sock))

    def restart(self, start_timeout: float) -> None:
        """Replace every worker with a fresh one, as an ordinary pool does (the machines and
        environments are kept); the cluster's record names the new workers."""
        from skyward.clusters.state import ClusterStore

        problems = self._stop_workers(graceful=False)
        for transport in self._transports:
            try:
                if not end_trees(transport, self.trees or [t for _, t in self.record.workers]):
                    problems.append(f"{transport.host}: cluster workers still running after kill")
            except ConnectionError as exc:
                problems.append(f"{transport.host}: not confirmed gone ({exc})")
        if problems:
            raise ClusterError(self.record.name, "its old workers could not be stopped to start new ones:\n  "
                               + "\n  ".join(problems), way_out=f"`skyward down {self.record.name}` ends them")
        if not all(launch.argv for launch in self._launches):  # attached: nothing prepared yet
            self._launches = self._prepare(self.image if self.image is not None else self.record.image)
        self.spawn_residents = True
        self.trees = []
        self.spawn(start_timeout)
        pids = [c.pid or 0 for c in self.connections]
        self.record = self.record.with_(workers=tuple(zip(pids, self.trees, strict=True)))
        ClusterStore().put(self.record)

    # -- stop ----------------------------------------------------------------------------------
    def keep_connections(self) -> dict[int, Transport]:
        """The nodes' connections by node number, left open by :meth:`detach`: the caller asks
        the nodes more over them (``exec`` follows its job's log) and closes them."""
        self.kept = True
        return {inst.node: transport for inst, transport in zip(self.instances, self._transports, strict=True)}

    def detach(self) -> list[str]:
        """Leave the workers running: each ends this client's session (its tasks cancelled)."""
        self._stop_heartbeat.set()
        for conn in self.connections:
            if conn.alive:
                try:
                    conn.send((Kind.DETACH,))
                except Exception:  # noqa: S110 - its bridge is gone already: nothing to detach
                    pass
            conn.begin_stop(graceful=False)
        # The worker answers DETACH with BYE and closes the socket, which ends the bridge; each
        # bridge is confirmed gone by a round trip to its node: all at once, not one after another.
        grace_end = time.monotonic() + 2.0
        found = each(lambda conn: conn.finish_stop(grace_end), [(c,) for c in self.connections], self.parallelism)
        problems = [f"{conn.where}: {problem}" for conn, problem in zip(self.connections, found, strict=True) if problem]
        for transport in [] if self.kept else self._transports:
            try:
                transport.close()
            except Exception:  # noqa: S110 - nothing held: closing is best effort
                pass
        return problems

    def down(self, *, release: bool = True) -> list[str]:
        """Stop every worker (confirmed gone) and release the machines; return problems."""
        self._stop_heartbeat.set()
        problems = self._stop_workers(graceful=True) if self.connections else []
        trees = self.trees or [tree for _, tree in self.record.workers]
        instances = self.instances or list(self.record.instances)
        if not self._transports and instances:
            # (a stopped or terminated cloud machine runs no worker: nothing to end there)
            self._transports = [reach(inst) for inst in _running(self.provider, instances)]
        for transport in self._transports:
            try:
                if not end_trees(transport, trees):
                    problems.append(f"{transport.host}: cluster workers still running after kill")
            except ConnectionError as exc:
                problems.append(f"{transport.host}: not confirmed gone ({exc})")
        self._remove_secret_files()
        for transport in self._transports:
            try:
                transport.close()
            except Exception:  # noqa: S110 - best effort
                pass
        if release:
            try:
                held = self.instances or list(self.record.instances)
                if self.record.pool_id:  # everything of the cluster's pool, also what a client
                    self.provider.end_pool(self.record.pool_id, held)  # killed while launching left
                else:
                    self.provider.terminate(held)
            except Exception as exc:
                problems.append(f"releasing machines failed: {exc!r}")
        return problems


def _running(provider: Provider, instances: list[Instance]) -> list[Instance]:
    """The instances whose machines run (all, for a provider that cannot say)."""
    states = getattr(provider, "machine_states", None)
    if states is None:
        return instances
    try:
        now = states(instances)
    except Exception:  # the cloud cannot say now: try every machine
        return instances
    return [inst for inst, state in zip(instances, now, strict=True) if state == "running"]


def bridge(transport: Transport, launch: WorkerLaunch, sock: str) -> WorkerLaunch:
    """What the client starts on the node to reach the worker listening on ``sock``."""
    python = transport.expand(launch.python)
    return WorkerLaunch((python, "-I", "-c", BRIDGE, sock), python=python)


def resident_command(launch: WorkerLaunch, sock: str, idle_minutes: float | None, tree: str,
                     heartbeat_file: str | None = None, in_step: bool = False) -> str:
    """The shell command that starts a resident worker as ``launch`` starts an ordinary one;
    it returns once the worker listens on ``sock`` (see :func:`skyward.worker.resident.daemonize`),
    or, ``in_step`` (a job step, :mod:`skyward.clusters.steps`), once the worker ends."""
    args = ["--resident", sock] + (["--in-step"] if in_step else [])
    if idle_minutes is not None:
        args += ["--autostop", f"{idle_minutes * 60:g}"]
    if heartbeat_file:
        args += ["--heartbeat-file", heartbeat_file]
    argv = list(launch.argv)
    if argv[:2] == ["bash", "-c"] and len(argv) == 3:  # a prepared host's command line: pass args on
        argv = ["bash", "-c", argv[2] + ' "$@"', "skyward-worker", *args]
    else:
        argv += args
    parts = []
    if launch.cwd:
        parts.append("cd " + shlex.quote(launch.cwd))
    # In the environment it starts with (/proc/PID/environ), so that every process of its tree,
    # the worker and its keepers included, can be found by it (end_trees).
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in {**launch.env, TREE_VARIABLE: tree}.items())
    parts.append((f"env {env} " if env else "") + shlex.join(argv))
    return " && ".join(parts)


def end_trees(transport: Transport, trees: list[str], timeout: float = 10.0) -> bool:
    """Kill every process on the machine whose environment carries one of ``trees`` (a
    resident worker's whole tree, detached processes included) until none is left; False if
    some still are after ``timeout``. Raises ConnectionError when the machine cannot be asked."""
    if not trees:
        return True
    pattern = " ".join(shlex.quote(f"{TREE_VARIABLE}={t}") for t in trees)
    check = (f"p=; for t in {pattern}; do p=\"$p $(grep -lzx \"$t\" /proc/[0-9]*/environ 2>/dev/null "
             f"| cut -d/ -f3)\"; done; p=$(echo $p); "
             f"if [ -n \"$p\" ]; then kill -9 $p 2>/dev/null; echo alive; else echo gone; fi")
    deadline = time.monotonic() + timeout
    for _ in Backoff(timeout=timeout, delay=0.05, factor=1.5, max_delay=0.5):
        try:
            result = transport.run(check, timeout=max(1.0, deadline - time.monotonic()))
        except Exception as exc:
            raise ConnectionError(f"cannot reach {transport.host}: {type(exc).__name__}: {exc}") from exc
        words = result.stdout.split()
        if words and words[-1] == "gone":
            return True
    return False
