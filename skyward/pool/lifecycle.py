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
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import replace
from typing import Any

from skyward import events as ev
from skyward._retry import Backoff
from skyward.errors import BootstrapError, PluginError, SkywardError
from skyward.pool.connection import NodeConnection
from skyward.pool.prepare import prepare
from skyward.protocol import Payload
from skyward.providers.base import Instance, PoolSpec, Provider
from skyward.runtime import InstanceInfo, Peer
from skyward.transport import Transport, WorkerLaunch, reach


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

    # -- start ---------------------------------------------------------------------------------
    def start(self, image: Any, start_timeout: float, heartbeat: tuple[float, float]) -> None:
        """Provision, prepare and start every node; raise at the first failure (the caller stops
        what started). ``heartbeat`` is (interval, lost_after) seconds."""
        for node in range(self.spec.nodes):
            self._emit(ev.NodeStage(node, "provisioning"))
        self.instances = self.provider.provision(self.spec)
        self._transports = [reach(inst) for inst in self.instances]
        self._launches = self._prepare(image)  # bounded by each environment's own timeouts
        # Heartbeats from the first worker on: a slow around_app (a model download, say) must
        # not trip the workers' dead man's switch; start_timeout alone bounds the start.
        self._start_heartbeat(heartbeat)
        self.spawn(start_timeout)

    def _start_heartbeat(self, heartbeat: tuple[float, float]) -> None:
        threading.Thread(target=self._heartbeat_loop, args=heartbeat, name="skyward-heartbeat",
                         daemon=True).start()

    def _prepare(self, image: Any) -> list[WorkerLaunch]:
        def one(inst: Instance, transport: Transport) -> WorkerLaunch:
            if inst.environment is not None:
                self._emit(ev.NodeStage(inst.node, "bootstrapping", inst.private_addr))
            launch = prepare(inst, transport, image, lambda line: self._emit(ev.NodeLog(inst.node, line)))
            if launch.cleanup:  # kept even when another node fails: stop() deletes them
                self._cleanup.append((inst, transport, launch.cleanup))
            return launch

        pairs = list(zip(self.instances, self._transports, strict=True))
        if len(pairs) == 1:
            return [one(*pairs[0])]
        with ThreadPoolExecutor(max_workers=min(32, len(pairs))) as executor:
            futures = [executor.submit(one, *pair) for pair in pairs]
        for f in futures:
            if f.exception() is not None:
                raise f.exception()  # type: ignore[misc]
        return [f.result() for f in futures]

    def spawn(self, start_timeout: float) -> None:
        """Start the workers on every prepared node (``processes`` each) and wait until each has
        said READY."""
        deadline = time.monotonic() + start_timeout
        self.connections = connections = []  # stop() stops whatever started, even on failure
        for inst, transport, launch in zip(self.instances, self._transports, self._launches, strict=True):
            self._emit(ev.NodeStage(inst.node, "starting", inst.private_addr))
            for local_rank in range(self.processes):
                connections.append(NodeConnection(inst.node, transport.host,
                                                  self._open(inst, transport, launch, local_rank), self._emit,
                                                  self._listening, spin=self._spin, local_rank=local_rank,
                                                  processes=self.processes))
        head_port = self.provider.rendezvous_port(self.spec)
        peers = tuple(Peer(i.node, i.private_addr) for i in self.instances)
        by_node = {inst.node: inst for inst in self.instances}
        for conn in connections:
            inst = by_node[conn.node]
            info = InstanceInfo(node=inst.node, total_nodes=self.spec.nodes, head_addr=peers[0].addr,
                                head_port=head_port, accelerators=inst.accelerators, peers=peers,
                                pool_id=self.spec.pool_id, local_rank=conn.local_rank,
                                processes_per_node=self.processes)
            settings = self._settings(info)
            if getattr(inst, "spot", False):  # (an Instance recorded before spot was known has none)
                settings = replace(settings, watch_preemption=True)
            conn.setup(settings, self._plugins)
        # Wait for all at once: a node whose around_app failed must be reported at once, not
        # after the nodes blocked waiting for it in a rendezvous have timed out.
        pending = {conn.ready: conn for conn in connections}
        while pending:
            done, _ = wait(pending, timeout=max(0.0, deadline - time.monotonic()), return_when=FIRST_COMPLETED)
            if not done:
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
            _await_consumed(inst, transport, launch)
        _write_files(inst, transport, launch)
        return transport.start(launch)

    def restart(self, start_timeout: float) -> None:
        """Replace every worker with a fresh one (machines and environments are kept)."""
        problems = self._stop_workers(graceful=False)
        if problems:
            raise SkywardError("could not stop the old workers:\n  " + "\n  ".join(problems))
        self.spawn(start_timeout)

    def _heartbeat_loop(self, interval: float, lost_after: float) -> None:
        while not self._stop_heartbeat.wait(interval):
            for conn in self.connections:
                conn.keepalive(lost_after)

    # -- stop ----------------------------------------------------------------------------------
    def stop(self, *, graceful: bool) -> list[str]:
        """Stop every worker, close every transport, release every machine; return problems."""
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

    def _remove_secret_files(self) -> None:
        """Delete each machine's env file (WorkerLaunch.cleanup); a machine that cannot be
        reached is named on stderr (its files stay until it is reached or released)."""
        import shlex
        import sys

        for inst, transport, paths in self._cleanup:
            try:
                ok = transport.run("rm -f -- " + " ".join(shlex.quote(p) for p in paths), timeout=30.0).ok
            except Exception:
                ok = False
            if not ok:
                print(f"skyward: node {inst.node} ({transport.host}): could not delete {', '.join(paths)}",
                      file=sys.__stderr__)
        self._cleanup = []

    def _stop_workers(self, *, graceful: bool) -> list[str]:
        for conn in self.connections:
            if conn.local_rank == 0:
                self._emit(ev.NodeStage(conn.node, "stopping"))
            conn.begin_stop(graceful=graceful)
        grace_end = time.monotonic() + (5.0 if graceful else 0.0)
        problems = []
        for conn in self.connections:
            problem = conn.finish_stop(grace_end)
            if problem:
                problems.append(f"{conn.where}: {problem}")
            if conn.local_rank == self.processes - 1:
                self._emit(ev.NodeStage(conn.node, "stopped"))
        return problems


def _write_files(inst: Instance, transport: Transport, launch: WorkerLaunch) -> None:
    """Write the files a worker reads as it starts (the image's env; it deletes them)."""
    for path, data in launch.files:
        try:
            transport.put_bytes(data, path, mode=0o600)
        except SkywardError:
            raise
        except Exception as exc:
            raise BootstrapError(transport.host, "starting worker", f"could not write {path}: {type(exc).__name__}",
                                 node=inst.node) from exc


def _await_consumed(inst: Instance, transport: Transport, launch: WorkerLaunch, timeout: float = 60.0) -> None:
    """Wait until the worker just started has read and deleted its files, so that writing them
    again for the node's next worker cannot race with that deletion."""
    for _ in Backoff(timeout=timeout, delay=0.01, factor=1.5, max_delay=0.5):
        if not any(transport.exists(path) for path, _ in launch.files):
            return
    raise BootstrapError(transport.host, "starting worker", f"the worker did not read its files within {timeout:g}s",
                         node=inst.node)
