"""Polling before sleeping: a reader that expects a frame soon polls for it a few tens of
microseconds before it blocks (``SKYWARD_SPIN_US``); see :func:`spinner` for why and when."""

from __future__ import annotations

import os
import resource
import select
import time
from typing import Any

#: How long a reader that is about to block keeps polling for the next frame first, unless the
#: environment says otherwise (``SKYWARD_SPIN_US``, microseconds; 0 turns it off).
SPIN_ENV = "SKYWARD_SPIN_US"
DEFAULT_SPIN_US = 50


def spin_from_env() -> float:
    """The spin window in seconds from ``SKYWARD_SPIN_US`` (ConfigError if it is not a count)."""
    raw = os.environ.get(SPIN_ENV, "").strip()
    if not raw:
        return DEFAULT_SPIN_US / 1e6
    try:
        us = int(raw)
    except ValueError:
        us = -1
    if us < 0:
        from skyward.errors import ConfigError

        raise ConfigError(SPIN_ENV, "a whole number of microseconds, 0 or more", raw)
    return us / 1e6


def spinner(fd: int, seconds: float) -> Any:
    """A function that polls ``fd`` without sleeping for up to ``seconds``; None if 0.

    Falling asleep in a blocking read and being woken costs, on a small VM, more than a whole
    round trip (the idle CPU must be woken, then the caches are cold): a reader that expects an
    answer soon is better off polling for it for a few tens of microseconds first. A poll with
    timeout 0 releases the GIL, so other threads still run. Polling backs off by itself where it
    does not pay (long tasks, busy CPUs) and is off with a single CPU.
    """
    if seconds <= 0 or _cpus() < 2:
        return None  # with one CPU, polling only keeps the writer we wait for from running
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    clock = time.perf_counter
    yield_cpu = getattr(os, "sched_yield", lambda: None)
    # Back off when polling does not pay: the answers take longer than the window, or the CPUs
    # are busy with other work (then our polling takes the CPU the writer needs). After each
    # poll that came up empty, the next 1, 2, 4, ... up to _MAX_SKIP waits block at once (a small
    # cap: the processes may move to CPUs of their own again, and polling should resume soon).
    # A poll that succeeds but had this thread preempted meanwhile counts as not paying too:
    # the CPUs are contended, and our polling delays the writer. That count is a system call
    # (0.7 µs, a tenth of a round trip's Python), so a poll that paid reads it only every
    # _CHECK_EVERY times: preemptions since the last reading are seen a few polls late, not lost.
    skip = backoff = unchecked = 0
    preempted = _preemptions()

    def spin() -> bool:
        nonlocal skip, backoff, preempted, unchecked
        if skip:
            skip -= 1
            return False
        end = clock() + seconds
        got = True
        while not poller.poll(0):
            if clock() >= end:
                got = False
                break
            yield_cpu()  # if the writer shares this CPU, let it run
        if got:
            unchecked += 1
            if unchecked < _CHECK_EVERY:
                return True
        unchecked = 0
        now = _preemptions()
        if got and now == preempted:
            backoff = 0
        else:
            backoff = min(backoff * 2 or 1, _MAX_SKIP)
            skip = backoff
        preempted = now
        return got

    return spin


def _preemptions() -> int:
    """How many times the CPU was taken from this thread (0 where that cannot be read)."""
    if _RUSAGE_THREAD is None:
        return 0
    return resource.getrusage(_RUSAGE_THREAD).ru_nivcsw


_MAX_SKIP = 16
#: A poll that paid reads the preemption count one time in this many (see spinner).
_CHECK_EVERY = 8
_RUSAGE_THREAD = getattr(resource, "RUSAGE_THREAD", None)


def _cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


