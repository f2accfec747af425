"""Starting workers on prepared machines: many at once, and the files each reads as it starts.

:func:`each` runs one step (preparing a machine, starting its workers) for many nodes, a bounded
number at a time (``ComputePool(start_parallelism=...)``): a node's step mostly waits (on a
connection, a process starting), so a 512-node pool does not pay 512 of those one after another.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from skyward._retry import Backoff
from skyward.errors import BootstrapError, SkywardError
from skyward.providers.base import Instance
from skyward.transport import Transport, WorkerLaunch


def each(fn: Callable[..., Any], calls: list[tuple[Any, ...]], parallelism: int) -> list[Any]:
    """``fn(*args)`` for each of ``calls``, ``parallelism`` at a time; the results in order, or
    the first failure raised once every call has ended (on Ctrl-C, those not begun never are)."""
    if len(calls) <= 1 or parallelism == 1:
        return [fn(*args) for args in calls]
    executor = ThreadPoolExecutor(max_workers=min(parallelism, len(calls)), thread_name_prefix="skyward-start")
    try:
        futures = [_submit(executor, fn, args) for args in calls]
        wait(futures)
    except BaseException:
        # Ctrl-C, SIGTERM: not waiting for the steps under way (a setup block may run for
        # hours); the pool's stop closes their connections, which ends them.
        executor.shutdown(wait=False, cancel_futures=True)
        raise
    executor.shutdown(wait=True)
    for f in futures:
        if f.exception() is not None:
            raise f.exception()  # type: ignore[misc]
    return [f.result() for f in futures]


def _submit(executor: ThreadPoolExecutor, fn: Callable[..., Any], args: tuple[Any, ...]) -> Future[Any]:
    """``fn(*args)`` on the executor, or here and now while the interpreter exits (a pool closed
    from ``atexit``: the executor takes no new work then, and the stop must still run)."""
    try:
        return executor.submit(fn, *args)
    except RuntimeError:
        done: Future[Any] = Future()
        try:
            done.set_result(fn(*args))
        except Exception as exc:
            done.set_exception(exc)
        return done


def write_files(inst: Instance, transport: Transport, launch: WorkerLaunch) -> None:
    """Write the files a worker reads as it starts (the image's env; it deletes them)."""
    for path, data in launch.files:
        try:
            transport.put_bytes(data, path, mode=0o600)
        except SkywardError:
            raise
        except Exception as exc:
            raise BootstrapError(transport.host, "starting worker", f"could not write {path}: {type(exc).__name__}",
                                 node=inst.node) from exc


def await_consumed(inst: Instance, transport: Transport, launch: WorkerLaunch, timeout: float = 60.0) -> None:
    """Wait until the worker just started has read and deleted its files, so that writing them
    again for the node's next worker cannot race with that deletion."""
    for _ in Backoff(timeout=timeout, delay=0.01, factor=1.5, max_delay=0.5):
        if not any(transport.exists(path) for path, _ in launch.files):
            return
    raise BootstrapError(transport.host, "starting worker", f"the worker did not read its files within {timeout:g}s",
                         node=inst.node)
