"""The features built on pools that a pool's own API reaches: named clusters
(``ComputePool(name=...)``, :mod:`skyward.clusters`) and the remote torch device
(``pool.device()``, :mod:`skyward.torch`).

Both are built on the pool, so the pool may not import them: it asks for them here, and the
package's public face (``skyward/__init__.py``, which every import of skyward runs first) puts
them here. What the pool needs of a named cluster is :class:`NamedSession`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

__all__ = ["NamedOpener", "NamedSession", "SpawnedJob", "features"]

T_co = TypeVar("T_co", covariant=True)


class SpawnedJob(Protocol[T_co]):
    """What ``pool.spawn`` returns and ``pool.job`` finds: a :class:`skyward.Job`."""

    @property
    def cluster(self) -> str: ...

    @property
    def id(self) -> int: ...

    @property
    def status(self) -> str: ...

    def result(self, timeout: float | None = None) -> T_co: ...

    def logs(self, follow: bool = False) -> str: ...

    def cancel(self) -> None: ...


class NamedSession(Protocol):
    """One pool's hold on a named cluster: it starts or attaches the workers, and detaches (or
    ends the cluster) when the pool closes; it puts spawned calls in the cluster's job queue and
    finds its jobs."""

    #: The cluster's record (``idle_minutes`` and ``down`` are read for the workers' autostop).
    record: Any

    def open(self, pool: Any, image: Any) -> None: ...

    def close(self, pool: Any, *, down: bool, failed: bool) -> list[str]: ...

    def spawn(self, pool: Any, pending: Any, broadcast: bool) -> SpawnedJob[Any]: ...

    def job(self, job: object) -> SpawnedJob[Any]: ...

    def jobs(self) -> list[SpawnedJob[Any]]: ...


#: ``(name, idle_minutes, down, shape) -> (session or None, shape with the cluster's values)``.
NamedOpener = Callable[[Any, Any, Any, dict[str, Any]], tuple[NamedSession | None, dict[str, Any]]]


class _Features:
    """Filled by ``skyward/__init__.py``; a pool that finds one missing says which."""

    def __init__(self) -> None:
        self.open_named: NamedOpener | None = None
        self.open_device: Callable[[Any, str, int], Any] | None = None

    def named(self) -> NamedOpener:
        if self.open_named is None:
            raise RuntimeError("named clusters are not available: import skyward first")
        return self.open_named

    def device(self) -> Callable[[Any, str, int], Any]:
        if self.open_device is None:
            raise RuntimeError("the remote torch device is not available: import skyward first")
        return self.open_device


features = _Features()
