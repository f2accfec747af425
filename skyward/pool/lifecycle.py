"""The machines and workers of one pool: provision, prepare, start, keep alive, stop, release.

Start: provision (the provider) → reach and prepare every machine in parallel
(:mod:`skyward.pool.prepare`, through the instance's transport) → start a worker on each →
send every worker its SETUP before waiting on any (plugins such as torch rendezvous in
``around_app``, which needs all of them at once) → wait for READY.

Stop: ask each worker to finish (graceful) or not → confirm every worker and what it started
is gone → delete the files holding the image's env (secrets) from each machine → close the
transports → release the machines (the provider confirms). Problems are
collected, not raised half-way: every step runs whatever failed before it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, InvalidStateError, wait
from dataclasses import replace
from typing import Any

from skyward import events as ev
from skyward.errors import BootstrapError, PluginError, SkywardError
from skyward.pool.connection import NodeConnection
from skyward.pool.prepare import prepare
from skyward.pool.starting import await_consumed, each, write_files
from skyward.protocol import Payload
from skyward.providers.base import Instance, PoolSpec, Provider
from skyward.runtime import InstanceInfo, Peer
from skyward.transport import Transport, WorkerLaunch, reach

#: How many workers' ends a stopping pool awaits at once (each waits on a thread).
STOP_PARALLELISM = 64


class Nodes:
    """One pool's machines and the worker on each (see the module docstring)."""

    def __init__(self, provider: Provider, spec: PoolSpec, processes: int, settings: Callable[[InstanceInfo], Any],
                 plugins: Payload, emit: Callable[[ev.Event], None], listening: list[Any], spin: float):
        self.provider = provider
        self.spec = spec
        self.processes = processes  # worker processes per node
        self._settings = settings  # the SETUP message for one node
        self._plugins = plugins
        self._emit = emit
        self._listening = listening
        self._spin = spin
        self.instances: list[Instance] = []
        #: One per worker process, in global rank order (node by node).
        self.connections: list[NodeConnection] = []
        self._transports: list[Transport] = []
        self._launches: list[WorkerLaunch] = []
        self._cleanup: list[tuple[Instance, Transport, tuple[str, ...]]] = []
        self._stop_heartbeat = threading.Event()
        self.image: Any = None
        self.start_timeout = 120.0
        #: How many nodes are prepared, and have their workers started, at once.
        self.parallelism = 32
        #: Called with (node, why) when a member's worker is lost (the pool's replace_lost);
        #: None (the default) leaves a lost node as it is, and costs the fast path nothing.
        self.on_lost: Callable[[int, str], None] | None = None
        #: Guards the member lists: each change replaces them whole, under this lock.
        self._members = threading.RLock()
        self._restarting = threading.Lock()
        #: Workers of nodes being added (pinged, not yet members) and node numbers taken by
        #: nodes being added; instance ids this pool lost (never acquired again).
        self._joining: list[list[NodeConnection]] = []
        self._reserved: set[int] = set()
        self.lost_ids: set[str] = set()
        self.closing = False
        #: Counts the times every worker was started (start, restart): a caller can tell
        #: whether every worker is fresh since it last looked.
        self.generation = 0
        #: New nodes join by restarting every worker with them (plugins whose around_app sets
        #: up a group that needs every worker at once: torch's process group).
        self.join_by_restart = False

    # -- start ---------------------------------------------------------------------------------
    def start(self, image: Any, start_timeout: float, heartbeat: tuple[float, float]) -> None:
        """Provision, prepare and start every node; raise at the first failure (the caller stops
        what started). ``heartbeat`` is (interval, lost_after) seconds."""
        self.image, self.start_timeout = image, start_timeout
        for node in range(self.spec.nodes):
            self._emit(ev.NodeStage(node, "provisioning"))
        def queued(line: str) -> None:  # what the provider's request waits for in a queue
            for node in range(self.spec.nodes):
                self._emit(ev.NodeStage(node, "provisioning", line))
        self.instances = self.provider.provision_waiting(self.spec, queued, start_timeout)
        self._transports = [reach(inst) for inst in self.instances]
        self._launches = self._prepare(image)  # bounded by each environment's own timeouts
        # Heartbeats from the first worker on: a slow around_app (a model download, say) must
        # not trip the workers' dead man's switch; start_timeout alone bounds the start.
        self._start_heartbeat(heartbeat)
        self.spawn(start_timeout)

    def _start_heartbeat(self, heartbeat: tuple[float, float]) -> None:
        threading.Thread(target=self._heartbeat_loop, args=heartbeat, name="skyward-heartbeat",
                         daemon=True).start()

    def _prepare(self, image: Any, instances: list[Instance] | None = None,
                 transports: list[Transport] | None = None) -> list[WorkerLaunch]:
        """Prepare ``instances`` (default: all) in parallel; their launches, in the same order."""
        def one(inst: Instance, transport: Transport) -> WorkerLaunch:
            if inst.environment is not None:
                self._emit(ev.NodeStage(inst.node, "bootstrapping", inst.private_addr))
            launch = prepare(inst, transport, image, lambda line: self._emit(ev.NodeLog(inst.node, line)))
            if launch.cleanup:  # kept even when another node fails: stop() deletes them
                with self._members:
                    self._cleanup.append((inst, transport, launch.cleanup))
            return launch

        pairs = list(zip(self.instances if instances is None else instances,
                         self._transports if transports is None else transports, strict=True))
        return each(one, pairs, self.parallelism)

    def spawn(self, start_timeout: float) -> None:
        """Start the workers on every prepared node (``processes`` each) and wait until each has
        said READY."""
        self.generation += 1
        self.connections = []  # stop() stops whatever started, even on failure
        self._spawn(list(zip(self.instances, self._transports, self._launches, strict=True)), self.instances,
                    start_timeout, self.connections)

    def _spawn(self, members: list[tuple[Instance, Transport, WorkerLaunch]], everyone: list[Instance],
               start_timeout: float, connections: list[NodeConnection], *, joining: bool = False) -> None:
        """Start the workers of ``members`` into ``connections`` and wait for their READY; each
        gets the InstanceInfo of a pool made of ``everyone`` (head: the lowest node number).
        ``joining``: nodes added to an open pool. Given up when the pool closes."""
        deadline, emit = time.monotonic() + start_timeout, self._emit if self.on_lost is None else self._watching_emit
        started: list[list[NodeConnection]] = [[] for _ in members]  # (kept on failure: stop() stops them)
        handed_over, handed, first = threading.Lock(), [False], len(connections)  # (see start_node)
        head_port = self.provider.rendezvous_port(self.spec)
        ordered = sorted(everyone, key=lambda i: i.node)
        peers = tuple(Peer(i.node, i.private_addr) for i in ordered)

        def setup(conn: NodeConnection, inst: Instance) -> None:
            # At once, not after all have started: a worker waits 60 s for it (SETUP_TIMEOUT)
            info = InstanceInfo(node=inst.node, total_nodes=len(ordered), head_addr=peers[0].addr,
                                head_port=head_port, accelerators=inst.accelerators, peers=peers,
                                pool_id=self.spec.pool_id, local_rank=conn.local_rank,
                                processes_per_node=self.processes)
            settings = self._settings(info)
            if getattr(inst, "spot", False):  # (an Instance recorded before spot was known has none)
                settings = replace(settings, watch_preemption=True)
            conn.setup(settings, self._plugins)

        def start_node(k: int, inst: Instance, transport: Transport, launch: WorkerLaunch) -> None:
            self._emit(ev.NodeStage(inst.node, "starting", inst.private_addr))
            for local_rank in range(self.processes):
                if handed[0]:  # interrupted (Ctrl-C): start nothing more
                    return
                conn = NodeConnection(inst.node, transport.host, self._open(inst, transport, launch, local_rank),
                                      emit, self._listening, spin=self._spin, local_rank=local_rank,
                                      processes=self.processes, explain=self.provider.explainer(inst))
                with handed_over:  # (in `connections` at once: the heartbeat pings it from now on)
                    late = handed[0]
                    for kept in () if late else (started[k], connections):
                        kept.append(conn)
                if not late:
                    setup(conn, inst)
                    continue
                # Started after the pool stopped waiting (Ctrl-C): unseen by stop(), stopped here.
                conn.begin_stop(graceful=False)
                conn.finish_stop(time.monotonic())
                return

        try:
            each(start_node, [(k, *member) for k, member in enumerate(members)], self.parallelism)
        finally:
            with handed_over:  # (the same ones, in the members' order)
                handed[0] = True
                connections[first:] = [conn for node in started for conn in node]
        # Wait for all at once: a node whose around_app failed must be reported at once, not
        # after the nodes blocked waiting for it in a rendezvous have timed out.
        pending = {conn.ready: conn for conn in connections}
        while pending:
            left = max(0.0, deadline - time.monotonic())
            done, _ = wait(pending, timeout=min(left, 0.5), return_when=FIRST_COMPLETED)
            if self.closing:  # (an addition or a restart of an elastic pool that is closing)
                raise SkywardError("the pool closed while its workers were starting")
            if not done and time.monotonic() >= deadline:
                late = next(iter(pending.values()))
                raise BootstrapError(late.host, "starting worker", f"not ready within {start_timeout:g}s",
                                     node=late.node, log_tail=list(late.tail))
            failed = [pending[f] for f in done if f.exception() is not None]
            if failed:
                # A FATAL (the plugin's own error) says more than a loss it caused elsewhere.
                first = min(failed, key=lambda c: (not isinstance(c.ready.exception(), PluginError), c.node))
                raise first.ready.exception()  # type: ignore[misc]
            for f in done:
                conn = pending.pop(f)
                if not any(c.node == conn.node for c in pending.values()):  # its node's last one
                    self._emit(ev.NodeStage(conn.node, "ready"))

    def _open(self, inst: Instance, transport: Transport, launch: WorkerLaunch, local_rank: int) -> Any:
        """Start one worker process on ``inst`` and return its channel."""
        if local_rank:  # the previous worker must have read (and deleted) its files first
            await_consumed(inst, transport, launch)
        write_files(inst, transport, launch)
        return transport.start(launch)

    def restart(self, start_timeout: float) -> None:
        """Replace every worker with a fresh one (machines and environments are kept)."""
        with self._restarting:
            problems = self._stop_workers(graceful=False)
            if problems:
                raise SkywardError("could not stop the old workers:\n  " + "\n  ".join(problems))
            self.spawn(start_timeout)

    def _heartbeat_loop(self, interval: float, lost_after: float) -> None:
        while not self._stop_heartbeat.wait(interval):
            for conn in self.connections:
                conn.keepalive(lost_after)
            for joining in self._joining:
                for conn in joining:
                    conn.keepalive(lost_after)

    # -- growing and shrinking an open pool (elastic pools, replace_lost) ---------------------
    def reserve(self, count: int, numbers: list[int] | None = None) -> list[int]:
        """Take node numbers for nodes about to be added: ``numbers``, or the ``count`` lowest
        that no live node (nor another addition) holds, so a DDP rank stays dense."""
        with self._members:
            if numbers is None:
                held = {i.node for i in self.instances} | self._reserved
                numbers = []
                n = 0
                while len(numbers) < count:
                    if n not in held:
                        numbers.append(n)
                    n += 1
            self._reserved.update(numbers)
            return numbers

    def grow(self, numbers: list[int]) -> list[Instance]:
        """Provision, prepare and start the nodes ``numbers`` (reserved) while the others run;
        they become members once every new worker is READY. On failure, or when the pool
        closes meanwhile, whatever was acquired is stopped and released before raising."""
        transports: list[Transport] = []
        connections: list[NodeConnection] = []
        instances: list[Instance] = []
        try:
            for node in numbers:
                self._emit(ev.NodeStage(node, "provisioning"))
            with self._members:
                exclude = frozenset({i.id for i in self.instances} | self.lost_ids)
                self._joining.append(connections)  # pinged from their SETUP on
            instances = self.provider.acquire(self.spec, numbers, exclude)
            transports = [reach(inst) for inst in instances]
            launches = self._prepare(self.image, instances, transports)
            added = list(zip(instances, transports, launches, strict=True))
            if self.closing:
                raise SkywardError("the pool closed while nodes were being added")
            if not self.join_by_restart:
                self._spawn(added, self.instances + instances, self.start_timeout, connections, joining=True)
            with self._members:
                if self.closing:
                    raise SkywardError("the pool closed while nodes were being added")
                members = sorted(list(zip(self.instances, self._transports, self._launches, strict=True)) + added,
                                 key=lambda m: m[0].node)
                self.instances = [m[0] for m in members]
                self._transports = [m[1] for m in members]
                self._launches = [m[2] for m in members]
                self.connections = sorted(self.connections + connections, key=lambda c: (c.node, c.local_rank))
        except BaseException:
            self._discard(instances, transports, connections)
            raise
        finally:
            with self._members:
                self._reserved.difference_update(numbers)
                self._joining = [j for j in self._joining if j is not connections]
        if self.join_by_restart:  # (the machines are members now: on failure, released as members)
            try:
                self.restart(self.start_timeout)
            except BaseException:
                for node in numbers:
                    self.release(node)
                raise
        return instances

    def abort_joining(self) -> None:
        """The pool is closing: kill the workers of nodes being added (a start that would hold
        teardown up, e.g. a plugin's around_app waiting), so that each addition fails now and
        releases what it acquired."""
        with self._members:
            joining = [conn for group in self._joining for conn in group]
        for conn in joining:
            conn.begin_stop(graceful=False)
            with contextlib.suppress(Exception):
                conn.channel.kill()
            with contextlib.suppress(InvalidStateError):
                if not conn.ready.done():
                    conn.ready.set_exception(SkywardError("the pool closed while this node was starting"))

    def release(self, node: int, *, lost: bool = False) -> list[str]:
        """Take node ``node`` out of the pool: stop its workers (confirmed gone), delete its env
        files, close its transport, release its machine. Returns the problems met. ``lost``: the
        node's worker was lost; if it went silent (its host may be unreachable, and is not
        waited on longer than the silent-node limits) its machine is never acquired again by
        this pool. (A worker that died on a host that answers leaves the host usable.)"""
        with self._members:
            keep = [k for k, inst in enumerate(self.instances) if inst.node != node]
            gone = [k for k, inst in enumerate(self.instances) if inst.node == node]
            instances = [self.instances[k] for k in gone]
            transports = [self._transports[k] for k in gone]
            self.instances = [self.instances[k] for k in keep]
            self._transports = [self._transports[k] for k in keep]
            self._launches = [self._launches[k] for k in keep]
            connections = [c for c in self.connections if c.node == node]
            self.connections = [c for c in self.connections if c.node != node]
            if lost and any(c.went_silent for c in connections):
                self.lost_ids.update(i.id for i in instances)
        return self._discard(instances, transports, connections, graceful=not lost)

    def _discard(self, instances: list[Instance], transports: list[Transport], connections: list[NodeConnection],
                 *, graceful: bool = False) -> list[str]:
        """Stop ``connections``, delete their machines' env files, close ``transports`` and
        release ``instances`` (not members of the pool any more); the problems met."""
        problems = self._stop_workers(graceful=graceful, connections=connections)
        silent = any(c.went_silent for c in connections)
        with self._members:
            ids = {i.id for i in instances}
            mine = [entry for entry in self._cleanup if entry[0].id in ids]
            self._cleanup = [entry for entry in self._cleanup if entry[0].id not in ids]
        if not silent:  # (a host that went silent is not asked: its worker deletes them as it starts)
            self._remove_secret_files(mine)
        for transport in transports:
            with contextlib.suppress(Exception):
                transport.close()
        if instances:
            try:
                self.provider.release(instances)
            except Exception as exc:
                problems.append(f"releasing node(s) {[i.node for i in instances]} failed: {exc!r}")
        return problems

    def _watching_emit(self, event: ev.Event) -> None:
        """The workers' events, a loss also told to :attr:`on_lost` (once per node that is a
        member: a worker of a node being added fails that addition instead)."""
        self._emit(event)
        if isinstance(event, ev.NodeStage) and event.stage == "lost" and not self.closing and self.on_lost:
            if any(c.node == event.node and not c.alive for c in self.connections):
                self.on_lost(event.node, event.detail)

    # -- stop ----------------------------------------------------------------------------------
    def stop(self, *, graceful: bool) -> list[str]:
        """Stop every worker, close every transport, release every machine; return problems.
        (An addition still under way when this runs releases what it acquired itself: the
        pool waits for those first, see :mod:`skyward.pool.elastic`.)"""
        self.closing = True
        self._stop_heartbeat.set()
        problems = self._stop_workers(graceful=graceful)
        self._remove_secret_files()
        for transport in self._transports:
            with contextlib.suppress(Exception):
                transport.close()
        try:
            self.provider.terminate(self.instances)
        except Exception as exc:
            problems.append(f"releasing machines failed: {exc!r}")
        return problems

    def _remove_secret_files(self, entries: list[tuple[Instance, Transport, tuple[str, ...]]] | None = None) -> None:
        """Delete each machine's env file (WorkerLaunch.cleanup; ``entries``: default all); a
        machine that cannot be reached is named on stderr (its files stay until it is reached
        or released)."""
        import shlex
        import sys

        if entries is None:
            entries, self._cleanup = self._cleanup, []
        for inst, transport, paths in entries:
            try:
                ok = transport.run("rm -f -- " + " ".join(shlex.quote(p) for p in paths), timeout=30.0).ok
            except Exception:
                ok = False
            if not ok:
                print(f"skyward: node {inst.node} ({transport.host}): could not delete {', '.join(paths)}",
                      file=sys.__stderr__)

    def _stop_workers(self, *, graceful: bool, connections: list[NodeConnection] | None = None) -> list[str]:
        connections = self.connections if connections is None else connections
        for conn in connections:
            if conn.local_rank == 0:
                self._emit(ev.NodeStage(conn.node, "stopping"))
            conn.begin_stop(graceful=graceful)
        grace_end = time.monotonic() + (5.0 if graceful else 0.0)
        for conn in connections if not graceful else ():
            conn.channel.begin_kill()
        # All at once (one after another, a 512-node pool interrupted while starting took 90 s):
        found = each(NodeConnection.finish_stop, [(conn, grace_end) for conn in connections], STOP_PARALLELISM)
        problems = []
        for conn, problem in zip(connections, found):
            if problem:
                problems.append(f"{conn.where}: {problem}")
            if conn.local_rank == self.processes - 1:
                self._emit(ev.NodeStage(conn.node, "stopped"))
        return problems
