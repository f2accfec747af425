"""Preemption notices inside a task's process: :class:`Preemption`, :func:`on_preempt` and the
state behind ``sky.instance_info().preempting`` (re-exported by :mod:`skyward.runtime`).

On a spot node the worker watches the cloud's instance metadata
(:mod:`skyward.worker.preemption`) and hands every notice to :func:`deliver` in each process
that runs tasks (the worker itself, and the executor's child processes). What is guaranteed:

1. Each kind of notice is taken once per process: a later copy of one already seen changes
   nothing (the worker and its children may hear of the same notice twice).
2. A callback registered with :func:`on_preempt` runs at most once, on a thread of its own in
   the process that registered it, in the context it was registered in (so what it prints is
   the registering task's output). A callback registered after a notice it waits for runs at
   once. An exception in it is printed on that stderr; nothing else happens.
3. By default callbacks wait for the interruption notice (the machine will go); with
   ``rebalance=True`` the earlier, weaker rebalance recommendation triggers them too.

Outside a pool nothing ever delivers a notice: callbacks register and never run. Imported on
workers: nothing heavy.
"""

from __future__ import annotations

import contextvars
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Literal

__all__ = ["Preemption", "PreemptionKind", "current", "deliver", "notices", "on_preempt"]

PreemptionKind = Literal["interruption", "rebalance"]


@dataclass(frozen=True, slots=True)
class Preemption:
    """A notice that this machine is about to be taken back.

    Attributes:
        kind: ``"interruption"`` (the machine will be stopped or terminated at ``at``, about
            two minutes after the notice) or ``"rebalance"`` (the machine is at elevated risk
            of interruption; it may still run for a long time, or the interruption notice may
            follow at once).
        action: what happens at ``at`` for an interruption: ``"terminate"``, ``"stop"`` or
            ``"hibernate"``; None for a rebalance recommendation.
        at: when (timezone-aware, UTC): the interruption's time, or when the rebalance
            recommendation was issued.
        heard: when this machine's worker read the notice (timezone-aware, UTC, by the
            machine's clock); None on a notice made by hand. Not compared: a notice equals
            another of the same kind, action and time, whenever each was heard.
    """

    kind: PreemptionKind
    action: str | None
    at: datetime
    heard: datetime | None = field(default=None, compare=False)

    @property
    def seconds_left(self) -> float:
        """Seconds from now until ``at`` (0 once it has passed)."""
        return max(0.0, (self.at - datetime.now(timezone.utc)).total_seconds())


@dataclass(eq=False)
class _Callback:
    fn: Callable[[Preemption], object]
    rebalance: bool
    context: contextvars.Context


_lock = threading.Lock()
_notices: dict[str, Preemption] = {}
_callbacks: list[_Callback] = []


def current() -> Preemption | None:
    """The strongest notice this process has received: the interruption notice when there is
    one, else the rebalance recommendation, else None."""
    return _notices.get("interruption") or _notices.get("rebalance")


def notices() -> tuple[Preemption, ...]:
    """Every notice this process has received, in the order of their kinds' strength."""
    with _lock:
        return tuple(_notices[k] for k in ("rebalance", "interruption") if k in _notices)


def on_preempt(callback: Callable[[Preemption], object], *, rebalance: bool = False) -> Callable[[], None]:
    """Run ``callback(notice)`` once when this machine receives a preemption notice.

    Call it inside a task: the callback runs in that task's process (on a thread of its own),
    at most once, when the spot interruption notice arrives (about two minutes before the
    machine goes), or at once when that notice has already arrived. With ``rebalance=True``
    an earlier rebalance recommendation runs it too. What it prints is the task's output; an
    exception in it is printed on the task's stderr and stops nothing else.

    Notices reach nodes that the provider rents as spot instances (AWS); elsewhere, and
    outside a pool, the callback is registered and never runs.

    Returns a function that unregisters the callback (it does nothing once it has run).

    Example:
        >>> @sky.compute
        ... def train(steps: int) -> int:
        ...     sky.on_preempt(lambda notice: save_checkpoint())  # ~2 minutes to do it
        ...     for step in range(steps):
        ...         if sky.instance_info().preempting:  # or look between steps
        ...             return step
        ...         ...
        ...     return steps
    """
    if not callable(callback):
        from skyward.errors import ConfigError

        raise ConfigError("callback", "a callable taking the Preemption notice", callback)
    entry = _Callback(callback, bool(rebalance), contextvars.copy_context())
    with _lock:
        _callbacks.append(entry)
        due = _due(entry)
    if due is not None:
        _start(entry, due)

    def cancel() -> None:
        with _lock:
            if entry in _callbacks:
                _callbacks.remove(entry)

    return cancel


def deliver(notice: Preemption) -> bool:
    """(Worker) Take ``notice`` in this process: record it and run the callbacks it is for.

    Returns False when a notice of that kind had already been taken (nothing changes)."""
    with _lock:
        if notice.kind in _notices:
            return False
        _notices[notice.kind] = notice
        due = [(entry, n) for entry in list(_callbacks) if (n := _due(entry)) is not None]
    for entry, n in due:
        _start(entry, n)
    return True


def _due(entry: _Callback) -> Preemption | None:
    """The notice ``entry`` should run for now, or None. (Under the lock.) An entry that
    runs leaves the registry: it runs once, and unregistering it afterwards does nothing."""
    notice = _notices.get("interruption") or (_notices.get("rebalance") if entry.rebalance else None)
    if notice is not None:
        _callbacks.remove(entry)
    return notice


def _start(entry: _Callback, notice: Preemption) -> None:
    threading.Thread(target=entry.context.run, args=(_run, entry.fn, notice),
                     name="skyward-on-preempt", daemon=True).start()


def _run(fn: Callable[[Preemption], object], notice: Preemption) -> None:
    try:
        fn(notice)
    except BaseException:  # reported, and nothing else: the task and the worker go on
        print(f"skyward: the on_preempt callback {getattr(fn, '__qualname__', fn)!r} failed:\n"
              + traceback.format_exc().rstrip(), file=sys.stderr)
    finally:
        for stream in (sys.stdout, sys.stderr):  # a partial last line goes out too
            try:
                stream.flush()
            except Exception:
                pass


def _reset() -> None:
    """(Tests) Forget every notice and callback of this process."""
    with _lock:
        _notices.clear()
        _callbacks.clear()
