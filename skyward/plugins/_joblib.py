"""``sky.plugins.joblib``: run ``joblib.Parallel`` batches as tasks on the pool.

Two hooks:

* ``transform`` (client): appends ``joblib`` to the image's pip packages.
* ``around_client`` (client, for the pool's lifetime): registers a joblib backend named
  ``"skyward"`` and makes it the active backend (``joblib.parallel_config``), so that inside
  ``with sky.ComputePool(...)`` a plain ``Parallel(n_jobs=-1)(delayed(f)(x) for x in xs)`` —
  or any library built on joblib, such as scikit-learn — sends each batch to the least busy
  node. Leaving the pool puts back the backend that was active before.

How the backend behaves:

* ``n_jobs=-1`` (and ``None``, the default) means every task slot of the pool:
  ``nodes * concurrency``; ``-2`` one fewer, and so on. A pool with a single slot still
  reports 2, so that the work goes to the pool rather than running here: joblib runs
  anything with one job in the calling process. An explicit ``n_jobs=1`` does just that.
* Each batch is one task (named ``joblib``) on the pool; results come back in input order,
  and a failing call raises its own exception type, with the remote traceback.
* Batch sizes adapt as in joblib's own backends (``batch_size="auto"``).
* A nested ``Parallel`` inside a task runs on that node with threads.
* ``parallel_config`` is per thread in joblib: the backend is active in the thread that
  entered the pool. In another thread, use ``joblib.parallel_config(backend="skyward")``,
  which selects the innermost open pool that has this plugin.

joblib is imported inside the hooks only (on the client) and by the tasks on the workers.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol

from skyward.compute import PendingCompute, TaskOptions
from skyward.errors import ConfigError
from skyward.plugins._base import PoolInfo, Plugin

if TYPE_CHECKING:
    from skyward.image import Image

__all__ = ["BACKEND_NAME", "TASK_NAME", "joblib", "use_pool"]

#: The name the backend is registered under with ``joblib.register_parallel_backend``.
BACKEND_NAME = "skyward"
#: What the pool's events and errors call each batch.
TASK_NAME = "joblib"

class Pool(Protocol):
    """What the backend asks of the pool ``around_client`` gives it (a
    :class:`~skyward.ComputePool` is one): a plugin does not import the pool."""

    nodes: int
    concurrency: int

    @property
    def is_open(self) -> bool: ...

    def submit(self, pending: PendingCompute[Any], /) -> Future[Any]: ...


# Pools inside which the backend is active, innermost last (for backend="skyward" by name).
_active: list[Pool] = []
_active_lock = threading.Lock()
_backend_class: type | None = None


def _run_batch(batch: Callable[[], Any]) -> Any:
    """The task each joblib batch becomes: call it on the worker, return its list of results."""
    return batch()


def slots(pool: Pool) -> int:
    """Task slots in ``pool``: its nodes times the tasks each node runs at once."""
    return int(pool.nodes) * int(pool.concurrency)


def _effective_n_jobs(pool: Pool, n_jobs: int | None) -> int:
    if n_jobs is None:
        n_jobs = -1
    if n_jobs == 0:
        raise ValueError("n_jobs == 0 in Parallel has no meaning")
    if n_jobs > 0:
        return int(n_jobs)
    # -1: every slot, -2: all but one, ... ; at least 2 so that joblib does not fall back to
    # running the calls sequentially in this process.
    return max(2, slots(pool) + 1 + int(n_jobs))


def _get_backend_class() -> type:
    """Build the backend class on first use, so that importing this module does not import joblib."""
    global _backend_class
    if _backend_class is not None:
        return _backend_class
    from skyward._optional import require

    parallel = require("joblib.parallel", "sky.plugins.joblib() and sky.plugins.sklearn()")
    AutoBatchingMixin, ParallelBackendBase = parallel.AutoBatchingMixin, parallel.ParallelBackendBase  # noqa: N806

    class SkywardBackend(AutoBatchingMixin, ParallelBackendBase):
        """A joblib backend that runs each batch as a task on a :class:`~skyward.ComputePool`."""

        supports_retrieve_callback = True
        supports_inner_max_num_threads = False
        uses_threads = False
        supports_sharedmem = False
        default_n_jobs = -1  # Parallel() with no n_jobs: every slot of the pool

        def __init__(self, pool: Pool, nesting_level: int | None = None,
                     inner_max_num_threads: int | None = None, **backend_kwargs: Any):
            super().__init__(nesting_level=nesting_level, inner_max_num_threads=inner_max_num_threads,
                             **backend_kwargs)
            self.pool = pool

        def effective_n_jobs(self, n_jobs: int | None) -> int:
            return _effective_n_jobs(self.pool, n_jobs)

        def configure(self, n_jobs: int | None = 1, parallel: Any = None, **backend_kwargs: Any) -> int:
            if not self.pool.is_open:
                raise ConfigError(
                    "joblib backend", f"an open ComputePool (joblib's {BACKEND_NAME!r} backend works inside "
                    "`with sky.ComputePool(..., plugins=[sky.plugins.joblib()])`)", repr(self.pool),
                )
            self.parallel = parallel
            return self.effective_n_jobs(n_jobs)

        def submit(self, func: Callable[[], Any], callback: Callable[[Any], Any] | None = None) -> Future[Any]:
            pending = PendingCompute(_run_batch, (func,), {}, TaskOptions(TASK_NAME))
            future = self.pool.submit(pending)
            future.get = future.result  # type: ignore[attr-defined]  # joblib's AsyncResult-style API
            if callback is not None:
                future.add_done_callback(callback)
            return future

        # joblib < 1.5 calls apply_async; the contract is the same.
        apply_async = submit

        def retrieve_result_callback(self, out: Future[Any]) -> Any:
            return out.result()

        def abort_everything(self, ensure_ready: bool = True) -> None:
            """A call failed: joblib stops dispatching and raises. Batches already sent run to
            completion and their results are dropped. They are deliberately not cancelled: a
            worker interrupts a running task with an asynchronous exception, which can land in
            the middle of an import (unpickling a batch imports its libraries) and leave that
            worker's modules half-initialised for every later task."""

        def __repr__(self) -> str:
            return f"SkywardBackend(pool={self.pool!r})"

        def __reduce__(self):
            # Batches carry the nested backend, never this one; a pool cannot travel anyway.
            raise TypeError("the skyward joblib backend is bound to an open pool and cannot be pickled")

    SkywardBackend.__module__ = __name__
    SkywardBackend.__qualname__ = "SkywardBackend"
    _backend_class = SkywardBackend
    return SkywardBackend


def _by_name(**backend_kwargs: Any) -> Any:
    """The factory registered as ``"skyward"``: a backend on the innermost open pool."""
    with _active_lock:
        pool = _active[-1] if _active else None
    if pool is None:
        raise ConfigError(
            "joblib backend", f"use of {BACKEND_NAME!r} inside "
            "`with sky.ComputePool(..., plugins=[sky.plugins.joblib()])`", "no open pool with that plugin",
        )
    return _get_backend_class()(pool, **backend_kwargs)


@contextlib.contextmanager
def use_pool(pool: Pool) -> Iterator[None]:
    """The ``around_client`` hook: make joblib run its batches on ``pool`` while it is open.

    Registers the ``"skyward"`` backend and enters ``joblib.parallel_config`` with a backend
    bound to ``pool`` (in the calling thread); on exit the previous configuration is back.
    Shared by ``sky.plugins.joblib()`` and ``sky.plugins.sklearn()``.
    """
    from skyward._optional import require

    _joblib = require("joblib", "sky.plugins.joblib() and sky.plugins.sklearn()")

    _joblib.register_parallel_backend(BACKEND_NAME, _by_name)
    backend = _get_backend_class()(pool)
    config = getattr(_joblib, "parallel_config", None) or _joblib.parallel_backend
    with _active_lock:
        _active.append(pool)
    try:
        with config(backend=backend):
            yield
    finally:
        with _active_lock:
            for i in range(len(_active) - 1, -1, -1):
                if _active[i] is pool:
                    del _active[i]
                    break


def _transform(image: Image, cluster: PoolInfo) -> Image:
    return image.with_pip("joblib")


def joblib() -> Plugin:
    """joblib on every node, and ``joblib.Parallel`` running its batches on the pool.

    Inside ``with sky.ComputePool(..., plugins=[sky.plugins.joblib()])``, every
    ``Parallel(n_jobs=-1)`` (or with no ``n_jobs``) spreads its batches over all
    ``nodes * concurrency`` task slots. See the module docstring for the details.

    >>> import skyward as sky
    >>> from joblib import Parallel, delayed                                  # doctest: +SKIP
    >>> with sky.ComputePool(nodes=2, plugins=[sky.plugins.joblib()]):        # doctest: +SKIP
    ...     Parallel(n_jobs=-1)(delayed(pow)(i, 2) for i in range(10))
    [0, 1, 4, 9, 16, 25, 36, 49, 64, 81]
    """
    return Plugin("joblib", transform=_transform, around_client=use_pool)
