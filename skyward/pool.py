"""``ComputePool``: the one place that knows the whole lifecycle of a pool.

validate → transform image (plugins) → provision → start workers → handshake (each gets its
``InstanceInfo``) → ready → dispatch → stop workers → confirm they are gone → release machines.

Every exit path of the ``with`` block — return, exception, Ctrl-C, SIGTERM — runs the same
teardown. A client killed outright (SIGKILL) is covered by the workers themselves: they exit
when their input ends or the client has been silent for ``idle_timeout`` seconds.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import Any, Literal, TypeVar, overload

from skyward import _signals
from skyward import events as ev
from skyward._node import NodeConnection
from skyward.compute import ComputeFunction, PendingCompute, TaskOptions, _iter_results
from skyward.errors import BootstrapError, ConfigError, ConnectionLost, PluginError, SkywardError, WorkerLost
from skyward.messages import Setup
from skyward.plugins._base import Cluster, Plugin
from skyward.protocol import Kind, dumps_payload, spin_from_env
from skyward.providers.base import Instance, PoolSpec, Provider
from skyward.runtime import InstanceInfo, Peer
from skyward.transport.base import WorkerLaunch

__all__ = ["ComputePool"]

T = TypeVar("T")
A = TypeVar("A")
Executor = Literal["thread", "process"]
_EXECUTORS = ("thread", "process")
#: Seconds the other nodes of a failed broadcast get to stop before their workers are replaced.
BROADCAST_GRACE = 2.0


def _positive(name: str, value: Any, *, integer: bool) -> Any:
    """Return ``value`` if it is an integer >= 1 (``integer``) or a number > 0; else ConfigError."""
    if integer:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
    else:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
    if not ok:
        raise ConfigError(name, "an integer >= 1" if integer else "a positive number of seconds", value)
    return value


class ComputePool:
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
        nodes: number of nodes (>= 1).
        image: the environment each node needs (:class:`~skyward.Image`).
        plugins: :class:`~skyward.Plugin` values, applied in list order (first outermost).
        concurrency: task slots per node (>= 1).
        executor: ``"thread"`` (tasks share the worker process) or ``"process"`` (each slot
            is a child process of the worker, started once).
        accelerator: e.g. ``"A100:8"``; providers that rent machines choose by it.
        idle_timeout: seconds without word from the client after which a worker stops itself,
            and without word from a worker after which the client declares it lost.
        start_timeout: seconds to wait for every worker to become ready once its machine is
            prepared (environment builds have their own limit, set on the provider).
        console: print task output with a ``[node N]`` prefix (and progress, when supported).
        on_event: a callback receiving every :mod:`skyward.events` event.

    Raises :class:`~skyward.ConfigError` for bad input before anything starts.
    """

    def __init__(
        self,
        provider: Provider | None = None,
        nodes: int = 1,
        *,
        image: Any = None,
        plugins: Sequence[Plugin] = (),
        concurrency: int = 1,
        executor: Executor = "thread",
        accelerator: Any = None,
        idle_timeout: float = 30.0,
        heartbeat_interval: float = 1.0,
        start_timeout: float = 120.0,
        console: bool = True,
        on_event: Callable[[ev.Event], None] | None = None,
    ):
        from skyward.image import Image
        from skyward.providers.local import Local

        provider = Local() if provider is None else provider
        if not isinstance(provider, Provider):
            raise ConfigError("provider", "a provider such as sky.Local(), sky.SSH(...) or sky.AWS(...)", provider)
        self.nodes = _positive("nodes", nodes, integer=True)
        self.concurrency = _positive("concurrency", concurrency, integer=True)
        if executor not in _EXECUTORS:
            raise ConfigError("executor", " or ".join(repr(e) for e in _EXECUTORS), executor)
        self.executor = executor
        self.idle_timeout = float(_positive("idle_timeout", idle_timeout, integer=False))
        self.heartbeat_interval = float(_positive("heartbeat_interval", heartbeat_interval, integer=False))
        self.start_timeout = float(_positive("start_timeout", start_timeout, integer=False))
        self._spin = spin_from_env()
        if image is None:
            image = Image()
        elif not isinstance(image, Image):
            raise ConfigError("image", "a sky.Image(...)", image)
        plugins = tuple(plugins)
        for i, plugin in enumerate(plugins):
            if not isinstance(plugin, Plugin):
                raise ConfigError(f"plugins[{i}]", "a sky.Plugin, e.g. sky.plugins.torch()", plugin)
        if accelerator is not None:
            from skyward.accelerators import parse_accelerator

            accelerator = parse_accelerator(accelerator)
        self.provider = provider
        self.plugins = plugins
        self.accelerator = accelerator
        self.image = image
        self.id = uuid.uuid4().hex[:8]
        self.spec = PoolSpec(self.id, self.nodes, accelerator, self.concurrency)
        self.provider.validate(self.spec)

        self._subscribers: list[Callable[[ev.Event], None]] = []
        if console:
            from skyward.console import Console

            self._subscribers.append(Console())
        if on_event is not None:
            self._subscribers.append(on_event)
        self._state: Literal["new", "starting", "open", "closed"] = "new"
        self._connections: list[NodeConnection] = []
        self._instances: list[Instance] = []
        self._transports: list[Any] = []
        self._launches: list[tuple[Any, WorkerLaunch]] = []
        self._client_stack = contextlib.ExitStack()
        self._stop_heartbeat = threading.Event()
        self._rr = 0
        self._pick_lock = threading.Lock()
        self._restore_signals: list[Callable[[], None]] = []

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
        except BaseException:
            self._stop(clean=False)
            raise
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._stop(clean=exc_type is None)

    def _start(self) -> None:
        started = time.monotonic()
        self._state = "starting"
        self._emit(ev.PoolStarting(self.id, self.nodes, self.provider.name))
        cluster = Cluster(self.nodes, self.accelerator, self.provider.name, self.concurrency)
        image = self.image
        for plugin in self.plugins:
            if plugin.transform is not None:
                with _plugin_hook(plugin, "transform"):
                    image = plugin.transform(image, cluster)
        self.image = image

        for node in range(self.nodes):
            self._emit(ev.NodeStage(node, "provisioning"))
        self._instances = self.provider.provision(self.spec)
        self._prepare_nodes(image)  # bounded by the provider's own bootstrap timeout
        self._connections = self._spawn_workers(deadline=time.monotonic() + self.start_timeout)

        threading.Thread(target=self._heartbeat_loop, name="skyward-heartbeat", daemon=True).start()
        for plugin in self.plugins:
            if plugin.around_client is not None:
                with _plugin_hook(plugin, "around_client"):
                    self._client_stack.enter_context(plugin.around_client(self))
        self._state = "open"
        self._emit(ev.PoolReady(self.id, self.nodes, time.monotonic() - started))

    def _prepare_nodes(self, image: Any) -> None:
        """Reach every node and prepare it (bootstrap, if any), all nodes in parallel."""

        def prepare(inst: Instance) -> tuple[Any, WorkerLaunch]:
            def log(line: str) -> None:
                self._emit(ev.NodeLog(inst.node, line))

            transport = self.provider.transport(inst)
            self._transports.append(transport)
            if not self.provider.uses_client_environment:
                self._emit(ev.NodeStage(inst.node, "bootstrapping", inst.private_addr))
            return transport, self.provider.worker_launch(inst, transport, image, log)

        if len(self._instances) == 1:
            self._launches = [prepare(self._instances[0])]
            return
        with ThreadPoolExecutor(max_workers=min(32, len(self._instances))) as executor:
            futures = [executor.submit(prepare, inst) for inst in self._instances]
        for f in futures:
            if f.exception() is not None:
                raise f.exception()  # type: ignore[misc]
        self._launches = [f.result() for f in futures]

    def _spawn_workers(self, deadline: float) -> list[NodeConnection]:
        """Start a worker on every prepared node and wait until each has said READY.

        Every worker gets its SETUP before any is waited on: plugins such as torch rendezvous
        in ``around_app``, which needs all of them at once.
        """
        connections: list[NodeConnection] = []
        self._connections = connections  # teardown stops whatever started, even on failure
        for inst, (transport, launch) in zip(self._instances, self._launches, strict=True):
            self._emit(ev.NodeStage(inst.node, "starting", inst.private_addr))
            connections.append(
                NodeConnection(inst.node, transport.host, transport.start(launch), self._emit, self._subscribers,
                               spin=self._spin)
            )

        head_port = self.provider.rendezvous_port(self.spec)
        peers = tuple(Peer(i.node, i.private_addr) for i in self._instances)
        plugins_payload = dumps_payload(list(self.plugins))
        for inst, conn in zip(self._instances, connections, strict=True):
            info = InstanceInfo(
                node=inst.node, total_nodes=self.nodes, head_addr=peers[0].addr, head_port=head_port,
                accelerators=inst.accelerators, peers=peers, pool_id=self.id,
            )
            setup = Setup(
                info=info, env=dict(self.image.env), concurrency=self.concurrency, executor=self.executor,
                idle_timeout=self.idle_timeout, heartbeat_interval=self.heartbeat_interval, spin=self._spin,
            )
            conn.send((Kind.SETUP, setup), plugins_payload)

        for conn in connections:
            try:
                conn.ready.result(timeout=max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                raise BootstrapError(
                    conn.host, "starting worker", f"not ready within {self.start_timeout:g}s",
                    node=conn.node, log_tail=list(conn.tail),
                ) from None
            self._emit(ev.NodeStage(conn.node, "ready"))
        return connections

    def _stop_workers(self, connections: list[NodeConnection], *, graceful: bool) -> list[str]:
        """Stop the given workers, confirm they are gone, fail what they still had; return problems."""
        problems: list[str] = []
        for conn in connections:
            self._emit(ev.NodeStage(conn.node, "stopping"))
            conn.closing = True
            conn.listen()
            if conn.alive and graceful:
                with contextlib.suppress(OSError, ValueError):
                    conn.writer.send((Kind.SHUTDOWN,))
        grace_end = time.monotonic() + (5.0 if graceful else 0.0)
        for conn in connections:
            if conn.channel.wait(max(0.0, grace_end - time.monotonic())) is None:
                conn.channel.kill()
        for conn in connections:
            if not conn.channel.confirm_gone(5.0):
                problems.append(f"node {conn.node}: worker processes still running after kill")
            conn.join_reader(2.0)
            with conn.lock:
                leftovers, conn.tasks = conn.tasks, {}
            for task in leftovers.values():
                if task.timer:
                    task.timer.cancel()
                if not task.future.done():
                    task.future.set_exception(ConnectionLost(conn.node, "the worker was stopped before the task finished"))
            self._emit(ev.NodeStage(conn.node, "stopped"))
        return problems

    def restart_workers(self) -> None:
        """Replace every worker with a fresh one (machines and environments are kept).

        The pool does this by itself when a broadcast fails and some nodes cannot be stopped
        (e.g. blocked in a collective operation); plugins' ``around_app`` hooks run again.
        """
        self._require_open()
        with self._pick_lock:
            old = self._connections
            problems = self._stop_workers(old, graceful=False)
            if problems:
                raise SkywardError("could not stop the old workers:\n  " + "\n  ".join(problems))
            self._spawn_workers(deadline=time.monotonic() + self.start_timeout)

    def _heartbeat_loop(self) -> None:
        while not self._stop_heartbeat.wait(self.heartbeat_interval):
            for conn in self._connections:
                if conn.alive and not conn.closing:
                    with contextlib.suppress(OSError, ValueError):
                        conn.writer.send((Kind.PING,))
                    conn.check_heartbeat(self.idle_timeout)

    def _stop(self, clean: bool) -> None:
        if self._state == "closed":
            return
        started = time.monotonic()
        was_open = self._state == "open"
        self._state = "closed"
        problems: list[str] = []
        try:
            self._client_stack.close()
        except Exception as exc:
            problems.append(f"around_client exit failed: {exc!r}")
        self._stop_heartbeat.set()
        problems += self._stop_workers(self._connections, graceful=was_open)
        for transport in self._transports:
            with contextlib.suppress(Exception):
                transport.close()
        try:
            self.provider.terminate(self._instances)
        except Exception as exc:
            problems.append(f"releasing machines failed: {exc!r}")
        self._restore_sigterm()
        self._emit(ev.PoolStopped(self.id, time.monotonic() - started, not problems))
        if problems and sys.exc_info()[0] is None:
            raise SkywardError("pool teardown incomplete:\n  " + "\n  ".join(problems))
        for p in problems:
            print(f"skyward: {p}", file=sys.__stderr__)

    def _install_sigterm(self) -> None:
        # SIGTERM would end the process without running finally blocks; turn it into an
        # exception so the with-block's teardown runs (only if nobody else installed a
        # handler). Both it and Ctrl-C's handler are guarded so that they never interrupt the
        # main thread in the middle of a frame (skyward._signals). Main thread only.
        if threading.current_thread() is not threading.main_thread():
            return

        def on_sigterm(signum: int, frame: Any) -> None:
            raise SystemExit(128 + signum)

        term = on_sigterm if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL else None
        self._restore_signals = [_signals.install(signal.SIGTERM, term), _signals.install(signal.SIGINT)]

    def _restore_sigterm(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for restore in reversed(self._restore_signals):
                restore()
            self._restore_signals = []

    # -- dispatch --------------------------------------------------------------------------------
    def _require_open(self) -> list[NodeConnection]:
        if self._state != "open":
            raise ConfigError(
                "pool", "an open ComputePool (dispatch inside `with sky.ComputePool(...) as pool:`)",
                f"a {self._state} pool" if self._state != "new" else "a pool that was never entered",
            )
        return self._connections

    def _least_busy(self) -> NodeConnection:
        conns = self._require_open()
        if len(conns) == 1 and conns[0].alive:
            return conns[0]
        with self._pick_lock:
            n = len(conns)
            start = self._rr
            self._rr = (self._rr + 1) % n
            best: NodeConnection | None = None
            for k in range(n):
                c = conns[(start + k) % n]
                if c.alive and (best is None or c.inflight < best.inflight):
                    best = c
        if best is None:
            lost = next((c.lost for c in conns if c.lost), None)
            raise lost or WorkerLost(0, "no worker is running")
        return best

    def submit(self, pending: PendingCompute[T]) -> Future[T]:
        """Run ``pending`` on the least busy node without waiting (same as ``pending > pool``)."""
        _check_pending(pending, "submit")
        conn = self._least_busy()
        return conn.submit(pending.payload(), pending.options.name, pending.options.timeout)

    def run(self, pending: PendingCompute[T]) -> T:
        """Run ``pending`` on the least busy node and return its result (``pending >> pool``)."""
        _check_pending(pending, "run")
        conn = self._least_busy()
        return conn.call(pending.payload(), pending.options.name, pending.options.timeout)

    def broadcast(self, pending: PendingCompute[T]) -> list[T]:
        """Run ``pending`` on every node; results ordered by node (``pending @ pool``).

        The call is serialized once. If a node fails, the others' tasks are cancelled and
        that node's error is raised.
        """
        _check_pending(pending, "broadcast")
        conns = self._require_open()
        for c in conns:
            if not c.alive:
                raise c.lost or WorkerLost(c.node, "worker is not running")
        payload = pending.payload()
        futures = [c.submit(payload, pending.options.name, pending.options.timeout) for c in conns]
        return self._collect(futures, conns, on_failure=self._recover_from_failed_broadcast)

    def _recover_from_failed_broadcast(
        self, futures: list[Future[Any]], conns: list[NodeConnection], error: BaseException
    ) -> None:
        """One node failed: stop the others' copies of the task, restarting workers if need be.

        The other nodes may be blocked in a collective operation waiting for the failed one (a
        DDP all-reduce, say) and would otherwise sit there until the framework's own timeout.
        They are asked to stop; a node that has not stopped within ``BROADCAST_GRACE`` seconds,
        or a node that was lost, leaves the pool's distributed state unusable, so every worker is
        replaced (plugins' ``around_app`` hooks run again) and the pool stays usable.
        """
        for f, conn in zip(futures, conns, strict=True):
            if not f.done():
                conn.interrupt(f)
        wait(futures, timeout=BROADCAST_GRACE)
        stuck = [c.node for f, c in zip(futures, conns, strict=True) if not f.done()]
        lost = [c.node for c in conns if not c.alive]
        if not stuck and not lost:
            return
        why = []
        if stuck:
            why.append(f"node(s) {stuck} did not stop within {BROADCAST_GRACE:g}s")
        if lost:
            why.append(f"node(s) {lost} were lost")
        try:
            self.restart_workers()
        except Exception as exc:
            self._note(error, f"skyward: {' and '.join(why)}; restarting the workers failed ({exc!r}), "
                              "closing the pool")
            self._stop(clean=False)
            return
        self._note(error, f"skyward: {' and '.join(why)}; every worker was restarted and the pool is usable")

    @staticmethod
    def _note(error: BaseException, text: str) -> None:
        with contextlib.suppress(Exception):
            error.add_note(text)

    def gather(self, *pending: PendingCompute[Any], stream: bool = False, ordered: bool = True) -> Any:
        """Run several pending calls concurrently across the pool.

        Returns a list in input order, or with ``stream=True`` an iterator yielding results
        as they become available (input order, or completion order with ``ordered=False``).
        """
        for i, p in enumerate(pending):
            _check_pending(p, f"gather() argument {i}")
        self._require_open()
        owners: list[NodeConnection] = []
        futures: list[Future[Any]] = []
        for p in pending:
            conn = self._least_busy()
            futures.append(conn.submit(p.payload(), p.options.name, p.options.timeout))
            owners.append(conn)
        if stream:
            return self._stream(futures, owners, ordered)
        return self._collect(futures, owners)

    @overload
    def map(self, fn: ComputeFunction[[A], T], iterable: Iterable[A]) -> list[T]: ...
    @overload
    def map(self, fn: Callable[[A], T], iterable: Iterable[A]) -> list[T]: ...
    def map(self, fn: Any, iterable: Iterable[Any]) -> list[Any]:
        """Run ``fn(item)`` for every item across the pool; results in input order."""
        if isinstance(fn, ComputeFunction):
            pending = [fn(item) for item in iterable]
        elif callable(fn):
            options = TaskOptions(getattr(fn, "__name__", "task"))
            pending = [PendingCompute(fn, (item,), {}, options) for item in iterable]
        else:
            raise ConfigError("fn", "a @sky.compute function or a callable", fn)
        return self.gather(*pending)

    def _collect(
        self,
        futures: list[Future[Any]],
        owners: list[NodeConnection],
        on_failure: Callable[[list[Future[Any]], list[NodeConnection], BaseException], None] | None = None,
    ) -> list[Any]:
        """Wait for every future; at the first failure stop the rest and raise that failure."""
        try:
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        except BaseException:  # Ctrl-C while waiting: stop what we started
            self._cancel(futures, owners)
            raise
        error = next((f.exception() for f in futures if f in done and f.exception() is not None), None)
        if error is not None:
            if on_failure is None:
                self._cancel(futures, owners)
            else:
                on_failure(futures, owners, error)
            raise error
        return [f.result() for f in futures]

    def _stream(self, futures: list[Future[Any]], owners: list[NodeConnection], ordered: bool) -> Iterator[Any]:
        try:
            yield from _iter_results(futures, ordered)
        finally:
            self._cancel(futures, owners)

    @staticmethod
    def _cancel(futures: list[Future[Any]], owners: list[NodeConnection]) -> None:
        for f, conn in zip(futures, owners, strict=True):
            if not f.done():
                conn.cancel(f)
                f.cancel()

    # -- introspection ---------------------------------------------------------------------------
    @property
    def is_open(self) -> bool:
        return self._state == "open"

    def worker_pids(self) -> list[int | None]:
        """The process id of each node's worker as the provider sees it (None if unknown)."""
        return [getattr(c.channel, "pgid", None) for c in self._connections]

    def __repr__(self) -> str:
        return f"ComputePool(provider={self.provider!r}, nodes={self.nodes}, state={self._state})"


@contextlib.contextmanager
def _plugin_hook(plugin: Plugin, hook: str) -> Iterator[None]:
    """Name the plugin when one of its client-side hooks fails (bad input stays a ConfigError)."""
    try:
        yield
    except SkywardError:
        raise
    except Exception as exc:
        import traceback

        raise PluginError(plugin.name, None, hook, f"{type(exc).__name__}: {exc}", traceback.format_exc()) from exc


def _check_pending(value: Any, where: str) -> None:
    if not isinstance(value, PendingCompute):
        raise ConfigError(where, "a pending computation (a call of a @sky.compute function)", type(value).__name__)
