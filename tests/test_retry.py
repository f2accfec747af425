"""skyward._retry: one schedule for every wait-and-try-again loop.

Internals on purpose: the schedule is checked against a fake clock here; through the public
API it shows only as waits of a few seconds (an SSH host that boots, a cloud API that throttles)."""

from __future__ import annotations

import threading
import time

import pytest

from skyward._retry import Backoff, retry


class FakeTime:
    """A clock that moves only when slept on, recording each pause."""

    def __init__(self) -> None:
        self.now = 0.0
        self.pauses: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds


def schedule(t: FakeTime, **options) -> Backoff:
    return Backoff(sleep=t.sleep, clock=t.clock, **options)


def test_pauses_grow_by_factor_up_to_max_delay() -> None:
    t = FakeTime()
    assert list(schedule(t, attempts=6, delay=0.5, factor=2, max_delay=3)) == [0, 1, 2, 3, 4, 5]
    assert t.pauses == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_the_first_attempt_is_immediate() -> None:
    t = FakeTime()
    for _ in schedule(t, timeout=10):
        break
    assert t.pauses == []


def test_no_pause_runs_past_the_deadline_and_the_last_look_is_at_it() -> None:
    t = FakeTime()
    seen = [t.now for _ in schedule(t, timeout=1.0, delay=0.4, factor=2)]
    assert seen == [0.0, 0.4, 1.0]  # the second pause (0.8) was cut to the deadline
    assert t.pauses == [0.4, pytest.approx(0.6)]


def test_a_spent_deadline_allows_exactly_one_attempt() -> None:
    t = FakeTime()
    assert list(schedule(t, timeout=0)) == [0]


def test_the_deadline_counts_from_the_start_of_iteration_not_creation() -> None:
    t = FakeTime()
    backoff = schedule(t, timeout=1.0, delay=1.0)
    t.now = 100.0
    assert list(backoff) == [0, 1]


def test_retry_returns_the_first_success_and_reports_each_retry() -> None:
    t = FakeTime()
    calls = []
    reports = []

    def flaky() -> str:
        calls.append(t.now)
        if len(calls) < 3:
            raise ConnectionError(f"try {len(calls)}")
        return "ok"

    result = retry(flaky, schedule(t, attempts=5, delay=1, factor=3), on=ConnectionError,
                   on_retry=lambda n, exc, pause: reports.append((n, str(exc), pause)))
    assert result == "ok"
    assert calls == [0, 1, 4]
    assert reports == [(1, "try 1", 1), (2, "try 2", 3)]


def test_retry_reraises_the_last_error_when_the_schedule_is_spent() -> None:
    t = FakeTime()
    errors = iter([OSError("first"), OSError("second"), OSError("last")])

    def failing() -> None:
        raise next(errors)

    with pytest.raises(OSError, match="last"):
        retry(failing, schedule(t, attempts=3), on=OSError)


def test_retry_does_not_catch_other_exceptions_or_those_given_up_on() -> None:
    t = FakeTime()
    with pytest.raises(KeyError):
        retry(lambda: {}["x"], schedule(t, attempts=5), on=OSError)
    with pytest.raises(PermissionError):
        retry(lambda: (_ for _ in ()).throw(PermissionError("no")), schedule(t, attempts=5), on=OSError,
              giveup=lambda exc: isinstance(exc, PermissionError))
    assert t.pauses == []


def test_retry_gives_up_at_the_deadline() -> None:
    t = FakeTime()
    attempts = []

    def never() -> None:
        attempts.append(t.now)
        raise TimeoutError

    with pytest.raises(TimeoutError):
        retry(never, schedule(t, timeout=5, delay=1, factor=1.5, max_delay=5), on=TimeoutError)
    assert attempts[0] == 0 and attempts[-1] == pytest.approx(5.0)
    assert t.now == pytest.approx(5.0)


def test_without_pauses_or_a_limit_retry_goes_on_until_giveup_says_stop() -> None:
    # (launch job recovery: its budgets, not the schedule, end the runs)
    t = FakeTime()
    budget = [2]
    runs = []

    def run() -> None:
        runs.append(t.now)
        raise RuntimeError(f"run {len(runs)}")

    def spent(exc: BaseException) -> bool:
        if budget[0] == 0:
            return True
        budget[0] -= 1
        return False

    with pytest.raises(RuntimeError, match="run 3"):
        retry(run, schedule(t, delay=0.0), on=RuntimeError, giveup=spent)
    assert runs == [0, 0, 0]


def test_an_error_in_on_retry_ends_the_retries_with_that_error() -> None:
    # (a broadcast whose lost node could not be replaced raises the replacement's error)
    t = FakeTime()
    calls = []

    def lost() -> None:
        calls.append(1)
        raise ConnectionError("lost")

    def replace(attempt: int, exc: BaseException, pause: float) -> None:
        raise LookupError("no replacement")

    with pytest.raises(LookupError, match="no replacement"):
        retry(lost, schedule(t, attempts=5), on=ConnectionError, on_retry=replace)
    assert calls == [1] and t.pauses == []


def test_a_pause_cut_short_by_its_sleep_leads_to_the_next_attempt_at_once() -> None:
    # (the elastic replacement pauses on its pool's "closed" event: a close ends the pause,
    # and the next failure is given up on)
    closed = threading.Event()
    attempts = []

    def grow() -> None:
        attempts.append(time.monotonic())
        raise OSError("no machine")

    threading.Timer(0.2, closed.set).start()
    started = time.monotonic()
    with pytest.raises(OSError):
        retry(grow, Backoff(attempts=3, delay=60.0, sleep=closed.wait), on=OSError,
              giveup=lambda exc: closed.is_set())
    assert len(attempts) == 2 and time.monotonic() - started < 30.0
