"""One way to try again: a schedule of attempts (:class:`Backoff`) and :func:`retry` over it.

Guarantees:

1. The first attempt happens at once. Between attempts the pause starts at ``delay`` and is
   multiplied by ``factor`` up to ``max_delay``; a pause never runs past the deadline.
2. No attempt *starts* after ``timeout`` seconds (counted from the start of iteration), except
   that the attempt after a pause cut short by the deadline still runs: the last look happens
   at the deadline, not before it. ``attempts`` caps the number of attempts as well.
3. :func:`retry` retries only the exceptions in ``on``, and not those ``giveup`` picks; when
   the schedule is spent it re-raises the last one unchanged.

Polling for a condition is a ``for`` loop over a :class:`Backoff`::

    for _ in Backoff(timeout=30, delay=0.1, max_delay=2):
        if done():
            break
    else:
        ...  # timed out
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

__all__ = ["Backoff", "retry"]

T = TypeVar("T")


class Backoff:
    """A schedule of attempts: iterate it to get attempt numbers 0, 1, 2... with pauses between."""

    def __init__(self, *, timeout: float | None = None, attempts: int | None = None, delay: float = 0.1,
                 factor: float = 2.0, max_delay: float = math.inf,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic):
        self.timeout = timeout
        self.attempts = attempts
        self.delay = delay
        self.factor = factor
        self.max_delay = max_delay
        self.sleep = sleep
        self.clock = clock

    def pauses(self) -> Iterator[float]:
        """The pause before each further attempt; ends when no attempt is left. The clock starts now."""
        deadline = None if self.timeout is None else self.clock() + self.timeout
        return self._pauses(deadline)

    def _pauses(self, deadline: float | None) -> Iterator[float]:
        pause = min(self.delay, self.max_delay)
        made = 1
        while self.attempts is None or made < self.attempts:
            if deadline is None:
                yield pause
            else:
                left = deadline - self.clock()
                if left <= 0:
                    return
                yield min(pause, left)
            pause = min(pause * self.factor, self.max_delay)
            made += 1

    def __iter__(self) -> Iterator[int]:
        pauses = self.pauses()
        yield 0
        for attempt, pause in enumerate(pauses, 1):
            self.sleep(pause)
            yield attempt


def retry(fn: Callable[[], T], schedule: Backoff, *,
          on: type[BaseException] | tuple[type[BaseException], ...] = Exception,
          giveup: Callable[[BaseException], bool] | None = None,
          on_retry: Callable[[int, BaseException, float], None] | None = None) -> T:
    """``fn()``, tried again on ``on`` exceptions as ``schedule`` allows; returns its first result.

    ``giveup(exc)`` true re-raises at once; ``on_retry(attempt, exc, pause)`` is called before
    each pause (``attempt`` is the number of the attempt about to be made, 1 for the first retry).
    """
    pauses = schedule.pauses()
    attempt = 0
    while True:
        try:
            return fn()
        except on as exc:
            if giveup is not None and giveup(exc):
                raise
            pause = next(pauses, None)
            if pause is None:
                raise
            attempt += 1
            if on_retry is not None:
                on_retry(attempt, exc, pause)
            schedule.sleep(pause)
