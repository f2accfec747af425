"""``ComputePool``: the user's handle on a pool, and the one place that orders its lifecycle.

validate → transform image (plugins) → provision → prepare → start workers → handshake (each
gets its ``InstanceInfo``) → ready → dispatch → stop workers → confirm they are gone → release
machines. The machines and workers are :class:`~skyward.pool.lifecycle.Nodes`; calls go
through :class:`~skyward.pool.dispatch.Dispatcher` (the methods that send them, ``submit`` to
``device``, are in :mod:`skyward.pool.calls`); events go to the subscribers (the console,
``on_event``, :meth:`ComputePool.subscribe`).

Every exit path of the ``with`` block — return, exception, Ctrl-C, SIGTERM — runs the same
teardown. A client killed outright (SIGKILL) is covered by the workers themselves: they exit
when their input ends or the client has been silent for ``idle_timeout`` seconds.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Literal

from skyward import events as ev
from skyward._features import NamedSession, features
from skyward.runtime.instance import node_environment
from skyward.errors import ConfigError, SkywardError
from skyward.messages import Setup
from skyward.plugins._base import PoolInfo, Plugin
from skyward.pool.calls import PoolCalls
from skyward.pool.dispatch import Dispatcher
from skyward.pool.elastic import check_provider, elastic_parts
from skyward.pool.guards import (
    install_exit_signals,
    plugin_hook,
    quiet_interrupt,
    restore_exit_signals,
)
from skyward.pool.lifecycle import Nodes
from skyward.protocol import dumps_payload, spin_from_env
from skyward.providers.base import PoolSpec, Provider
from skyward.runtime import InstanceInfo

__all__ = ["ComputePool"]

#: Plugins whose ``around_app`` forms a group of every worker of the pool at once.
GROUP_PLUGINS = frozenset({"torch", "jax"})

Executor = Literal["thread", "process"]


class ComputePool(PoolCalls):
    """A pool of nodes that run ``@sky.compute`` tasks. Use it as a context manager.

    >>> import skyward as sky
    >>> @sky.compute
    ... def square(x: int) -> int:
    ...     return x * x
    >>> with sky.ComputePool(nodes=2) as pool:  # doctest: +SKIP
    ...     square(3) >> pool                    # 9, on the least busy node
    ...     square(3) @ pool                     # [9, 9], one per node
    ...     pool.map(square, range(4))           # [0, 1, 4, 9]

    Parameters:
        provider: where the nodes come from; :class:`~skyward.Local` (default) runs them as
            processes on this machine.
        nodes: number of nodes (>= 1; default 1, or a named cluster's own), or ``(min, max)``
            for an elastic pool: it starts ``min`` nodes, adds nodes (up to ``max``) when tasks
            have waited ``scale_up_after`` seconds for a free slot, and releases a node idle
            for ``scale_down_after`` seconds while above ``min`` (see the Elastic pools page).
            ``pool.nodes`` is the number of nodes now; ``pool.min_nodes``/``pool.max_nodes``
            the limits.
        scale_up_after: (elastic pools) seconds a task waits for a slot before nodes are added.
        scale_down_after: (elastic pools) seconds a node is idle before it is released.
        replace_lost: provision a replacement (same node number) for a node whose worker is
            lost, so that the pool keeps its size. Default: True for ``(min, max)``, False
            for a number (a lost node's tasks raise :class:`~skyward.WorkerLost` and the pool
            goes on smaller).
        name: make this a named cluster (see the Clusters page): the first pool of that name
            creates it, later ones (any process) attach to the same workers; leaving the block
            detaches, :meth:`down` ends it. A shape that disagrees with the cluster's raises
            :class:`~skyward.ClusterError`; a cluster held by another client,
            :class:`~skyward.ClusterBusy`.
        idle_minutes: (named clusters) autostop: the nodes end the workers after this many
            minutes with no client attached (fractions allowed; 0: at once; on AWS the machines stop).
        down: (named clusters) make autostop a teardown; without ``idle_minutes`` (SkyPilot's
            ``--down``) the cluster ends once no client is attached and no job is left in its queue.
        image: the environment each node needs (:class:`~skyward.Image`).
        plugins: :class:`~skyward.Plugin` values, applied in list order (first outermost).
        concurrency: task slots per worker process (>= 1).
        processes_per_node: worker processes on each node (>= 1), as ``torchrun
            --nproc_per_node`` starts them; a broadcast runs on every process, ordered by global
            rank. Default: one per GPU with the torch plugin on CUDA nodes, else one.
        executor: ``"thread"`` (tasks share the worker process) or ``"process"`` (each slot
            is a child process of the worker, started once).
        accelerator: e.g. ``"A100:8"``; providers that rent machines choose by it.
        idle_timeout: seconds without word from the client after which a worker stops itself,
            and without word from a worker after which the client declares it lost.
        start_timeout: seconds to wait for every worker to become ready once its machine is
            prepared (environment builds have their own limit, set on the provider).
        start_parallelism: how many nodes are prepared and have their workers started at once
            (>= 1; default 32).
        console: print task output with a ``[node N]`` prefix (and progress, when supported).
        on_event: a callback receiving every :mod:`skyward.events` event.
        dashboard: show this pool, live, in ``skyward dashboard`` (also: ``SKYWARD_DASHBOARD=1``).

    Raises :class:`~skyward.ConfigError` for bad input before anything starts.
    """

    def __init__(
        self,
        provider: Provider | None = None,
        nodes: int | None = None,
        *,
        name: str | None = None,
        idle_minutes: float | None = None,
        down: bool = False,
        image: Any = None,
        plugins: Sequence[Plugin] = (),
        concurrency: int = 1,
        processes_per_node: int | None = None,
        executor: Executor = "thread",
        accelerator: Any = None,
        scale_up_after: float = 5.0,
        scale_down_after: float = 60.0,
        replace_lost: bool | None = None,
        idle_timeout: float = 30.0,
        heartbeat_interval: float = 1.0,
        start_timeout: float = 120.0,
        start_parallelism: int = 32,
        console: bool = True,
        on_event: Callable[[ev.Event], None] | None = None,
        dashboard: bool = False,
    ):
        from skyward.pool.options import pool_options

        self.name = name
        if name is not None and isinstance(nodes, (tuple, list)):
            raise ConfigError("nodes", "a number of nodes for a named cluster (an elastic named cluster, "
                              "nodes=(min, max) with name=, is not supported yet)", tuple(nodes))
        self._image_given = image is not None
        shape = {"provider": provider, "nodes": nodes, "accelerator": accelerator,
                 "processes_per_node": processes_per_node}
        self._cluster: NamedSession | None = None
        if name is not None or idle_minutes is not None or down:
            self._cluster, shape = features.named()(name, idle_minutes, down, shape)
        provider, nodes, accelerator, processes_per_node = (
            shape["provider"], shape["nodes"], shape["accelerator"], shape["processes_per_node"])
        options = pool_options(
            provider=provider, nodes=1 if nodes is None else nodes, image=image, plugins=plugins, concurrency=concurrency,
            processes_per_node=processes_per_node, scale_up_after=scale_up_after,
            scale_down_after=scale_down_after, replace_lost=replace_lost,
            executor=executor, accelerator=accelerator, idle_timeout=idle_timeout,
            heartbeat_interval=heartbeat_interval, start_timeout=start_timeout, console=console, on_event=on_event,
            start_parallelism=start_parallelism, dashboard=dashboard,
        )
        self.provider = options.provider
        self.min_nodes, self.max_nodes = options.limits
        self.elastic, self.replace_lost = options.elastic, options.replacing
        check_provider(options)
        self.concurrency = options.concurrency
        self.processes_per_node = options.processes
        self.executor = options.executor
        self.idle_timeout = options.idle_timeout
        self.heartbeat_interval = options.heartbeat_interval
        self.start_timeout = options.start_timeout
        self._spin = spin_from_env()
        self.plugins = options.plugins
        self.accelerator = options.accelerator
        self.image = options.image
        self.id = uuid.uuid4().hex[:8]
        #: ``SKYWARD_TASK_ID`` on every node: the same everywhere, unique per pool.
        self.task_id = f"skyward-{time.strftime('%Y%m%d-%H%M%S')}-{self.id}"
        self.spec = PoolSpec(self.id, self.min_nodes, self.accelerator, self.concurrency,
                             max_nodes=self.max_nodes if self.elastic else None)
        self.provider.validate(dataclasses.replace(self.spec, cluster=self.name))  # (which may refuse a named cluster)

        self._subscribers: list[Callable[[ev.Event], None]] = []
        self._console_attached = bool(options.console)
        if options.console:
            from skyward.console import Console

            self._subscribers.append(Console())
        if options.on_event is not None:
            self._subscribers.append(options.on_event)
        from skyward.console.snapshot import Snapshot, wanted

        if wanted(options.dashboard):
            self._subscribers.append(Snapshot())
        self._state: Literal["new", "starting", "open", "closed"] = "new"
        self._plugins_payload = dumps_payload(list(self.plugins))
        self._nodes = self._make_nodes(Nodes)
        self._nodes.parallelism = options.start_parallelism
        # A plugin whose around_app joins every worker in one group (torch's, jax's): a new node joins by restarting all.
        self._nodes.join_by_restart = any(p.name in GROUP_PLUGINS for p in self.plugins)
        self._elastic, queue = elastic_parts(options, self._nodes, self._emit)
        self._dispatch = Dispatcher(self._require_open, self.restart_workers, lambda: self._stop(clean=False),
                                    queue=queue, elastic=self._elastic, emit=self._emit,
                                    is_open=lambda: self._state == "open")
        self._client_stack = contextlib.ExitStack()
        #: Called first when the pool stops (remote torch devices close here).
        self._on_stop: list[Callable[[], None]] = []
        self._sky_devices: dict[tuple[int, str], Any] = {}
        self._restore_signals: list[Callable[[], None]] = []

    def _make_nodes(self, kind: type[Nodes], **extra: Any) -> Any:
        return kind(self.provider, self.spec, self.processes_per_node, self._settings, self._plugins_payload,
                    self._emit, self._subscribers, self._spin, **extra)

    # -- events ----------------------------------------------------------------------------------
    def subscribe(self, callback: Callable[[ev.Event], None]) -> Callable[[], None]:
        """Call ``callback`` with every event from now on; returns a function that unsubscribes."""
        self._subscribers.append(callback)
        return lambda: self._subscribers.remove(callback)

    def _emit(self, event: ev.Event) -> None:
        for callback in list(self._subscribers):
            try:
                callback(event)
            except Exception as exc:
                print(f"skyward: event callback {callback!r} failed: {exc!r}", file=sys.__stderr__)

    # -- lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> ComputePool:
        if self._state != "new":
            raise ConfigError("pool", "a new ComputePool (a pool can be entered once)", f"a {self._state} pool")
        self._install_sigterm()
        try:
            self._start()
        except BaseException as exc:
            self._stop(clean=False, interrupted=isinstance(exc, KeyboardInterrupt))
            quiet_interrupt(exc)
            raise
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        interrupted = isinstance(exc, KeyboardInterrupt)
        self._stop(clean=exc_type is None, interrupted=interrupted)
        quiet_interrupt(exc)

    def _start(self) -> None:
        started = time.monotonic()
        self._state = "starting"
        # (the console counts a node's task slots: every worker process's)
        self._emit(ev.PoolStarting(self.id, self.nodes, self.provider.name, self.concurrency * self.processes_per_node))
        cluster = PoolInfo(self.nodes, self.accelerator, self.provider.name, self.concurrency, self.processes_per_node)
        image = self.image
        for plugin in self.plugins:
            if plugin.transform is not None:
                with plugin_hook(plugin, "transform"):
                    image = plugin.transform(image, cluster)
        self.image = image
        if self._cluster is not None:
            self._cluster.open(self, image)
        else:
            self._nodes.start(image, self.start_timeout, (self.heartbeat_interval, self.idle_timeout))
        for plugin in self.plugins:
            if plugin.around_client is not None:
                with plugin_hook(plugin, "around_client"):
                    self._client_stack.enter_context(plugin.around_client(self))
        self._state = "open"
        if self._elastic is not None:
            self._elastic.start()
        self._emit(ev.PoolReady(self.id, self.nodes, time.monotonic() - started))

    def _settings(self, info: InstanceInfo) -> Setup:
        """The SETUP message for one node (its environment: the node's variables, then the image's)."""
        # breakpoint() in a task explains itself instead of reading the protocol as a terminal;
        # an image that names its own PYTHONBREAKPOINT (a remote debugger) keeps it.
        env = node_environment(info, self.task_id, cluster=self.name or f"skyward-{self.id}", provider=self.provider)
        env["PYTHONBREAKPOINT"] = "skyward.runtime.output.no_terminal_breakpoint"
        env.update(self.image.env)
        record = self._cluster.record if self._cluster is not None else None
        autostop = None if record is None or record.idle_minutes is None else record.idle_minutes * 60
        return Setup(info=info, env=env, concurrency=self.concurrency, executor=self.executor,
                     idle_timeout=self.idle_timeout, heartbeat_interval=self.heartbeat_interval, spin=self._spin,
                     autostop=autostop)

    def restart_workers(self) -> None:
        """Replace every worker with a fresh one (machines and environments are kept).

        The pool does this by itself when a broadcast fails and some nodes cannot be stopped
        (e.g. blocked in a collective operation); plugins' ``around_app`` hooks run again.
        """
        self._require_open()
        self._nodes.restart(self.start_timeout)

    def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until the pool has no lost node waiting for its replacement (``replace_lost``)
        and no replacement under way; raise the error of a replacement that failed, or
        TimeoutError after ``timeout`` seconds. Returns at once for a pool that replaces
        nothing. Which nodes are new: the :class:`~skyward.events.NodeAdded` events (reason
        ``"replacement"`` or ``"scale-up: ..."``) and :class:`~skyward.events.NodeRemoved`.

        >>> with sky.ComputePool(nodes=(2, 2)) as pool:  # doctest: +SKIP
        ...     try:
        ...         step() @ pool
        ...     except sky.WorkerLost:
        ...         pool.wait_ready(timeout=600)   # the lost node's replacement is up
        ...         step() @ pool
        """
        self._require_open()
        if self._elastic is not None:
            self._elastic.wait_ready(timeout)

    @property
    def cluster(self) -> NamedSession | None:
        """The pool's hold on its named cluster (``name=``), or None for an ordinary pool."""
        return self._cluster

    @property
    def nodes(self) -> int:
        """How many nodes the pool has now (``min_nodes`` before it starts)."""
        if self._state in ("new", "starting") or self._cluster is not None:
            return self.min_nodes
        return len(self._nodes.instances)

    def down(self) -> None:
        """End a named cluster: stop its workers (confirmed gone) and release its machines, as
        ``skyward down NAME`` does. Leaving the ``with`` block afterwards does nothing more.
        (An unnamed pool: the same as leaving its block.)"""
        self._stop(clean=True, down=True)

    def _stop(self, clean: bool, interrupted: bool = False, down: bool = False) -> None:
        if self._state == "closed":
            return
        started = time.monotonic()
        was_open = self._state == "open"
        self._state = "closed"
        problems: list[str] = []
        for close in self._on_stop:
            close()
        self._on_stop.clear()
        try:
            self._client_stack.close()
        except Exception as exc:
            problems.append(f"around_client exit failed: {exc!r}")
        if self._elastic is not None:  # nothing changes the pool from now on
            problems += self._elastic.stop(self.start_timeout + 30.0)
            if self._dispatch.queue is not None:
                self._dispatch.queue.fail_all(ConfigError("pool", "an open ComputePool", "a closed pool",
                                                          detail="the pool closed before the task was sent"))
        if self._cluster is not None:  # a named cluster: detach (or end it, when asked)
            problems += self._cluster.close(self, down=down, failed=not was_open)
        else:
            problems += self._nodes.stop(graceful=was_open)
        self._restore_sigterm()
        detached = self._cluster is not None and not down and was_open
        self._emit(ev.PoolStopped(self.id, time.monotonic() - started, not problems, interrupted, detached))
        if interrupted and not self._console_attached:
            left = "nothing left running" if not problems else "teardown incomplete"
            if detached:
                left = f"detached from cluster {self.name!r}, which stays up"
            print(f"skyward: interrupted: pool {self.id} stopped, {left}", file=sys.stderr)
        if problems and sys.exc_info()[0] is None:
            raise SkywardError("pool teardown incomplete:\n  " + "\n  ".join(problems))
        for p in problems:
            print(f"skyward: {p}", file=sys.__stderr__)

    def _install_sigterm(self) -> None:
        self._restore_signals = install_exit_signals()

    def _restore_sigterm(self) -> None:
        restore_exit_signals(self._restore_signals)
        self._restore_signals = []

    # -- notebooks: a pool across cells --------------------------------------------------------
    def open(self) -> ComputePool:
        """Start the pool without a ``with`` block (a notebook: one cell opens, later ones use it).

        The same as entering ``with``: the same start, and the same guarantees once started —
        the workers' dead man's switch, and :meth:`close` at interpreter exit if it was not
        called (a kernel restart included). Returns the pool::

            pool = sky.ComputePool(nodes=4).open()
            ...                                  # any number of cells
            pool.close()
        """
        self.__enter__()
        atexit.register(self._close_at_exit)
        return self

    def close(self) -> None:
        """Stop the pool opened with :meth:`open`: every worker and machine, confirmed released.

        Raises :class:`~skyward.SkywardError` when teardown could not be confirmed. Closing a
        closed pool does nothing.
        """
        atexit.unregister(self._close_at_exit)
        self._stop(clean=True)

    def _close_at_exit(self) -> None:
        with contextlib.suppress(Exception):
            self._stop(clean=True)

    def __repr__(self) -> str:
        shown = f"({self.min_nodes}, {self.max_nodes})" if self.elastic else str(self.nodes)
        return f"ComputePool(provider={self.provider!r}, nodes={shown}, state={self._state})"
