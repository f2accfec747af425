"""What the clusters cost, as the dashboard shows it: per cluster so far, per job, and this month.

Every figure is a price the plan used (a cluster's ``price_per_hour``: the sum of its machines'
catalog prices as rented; Local nodes cost $0; None where a price is unknown, as on SSH hosts)
times a time. Nothing is estimated past now.

* A cluster: its price from its launch to now (:func:`skyward.clusters.state.cost_so_far`).
* A cluster job: its cluster's price for as long as the job ran (the whole cluster is the job's
  while it runs).
* A managed job: what its clusters cost while the job had them: those ended (their ``down``
  event keeps the cost) and the one it has now.
* This month: the part inside this calendar month (local time) of every cluster known now and of
  every cluster ended this month (its ``down`` event), each at its price. A cluster ended before
  its timeline existed (or past the events kept) is not counted.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from skyward.clusters.state import ClusterStore, cost_so_far

if TYPE_CHECKING:
    from skyward.clusters.state import ClusterRecord, Event

__all__ = ["job_cost", "managed_cost", "month"]


def job_cost(record: ClusterRecord, started: float | None, ended: float | None) -> float | None:
    """Cluster ``record``'s price for the time a job ran on it (0 before it started)."""
    if record.price_per_hour is None:
        return None
    if started is None:
        return 0.0
    return round(record.price_per_hour * max(0.0, (ended or time.time()) - started) / 3600, 4)


def month_start(now: float | None = None) -> float:
    """When this calendar month began, in local time."""
    t = time.localtime(now)
    return time.mktime((t.tm_year, t.tm_mon, 1, 0, 0, 0, 0, 0, -1))


def _within(cost: float, since: float, until: float, start: float) -> float:
    """The part of ``cost`` (spent evenly from ``since`` to ``until``) from ``start`` on."""
    if until <= start:
        return 0.0
    if since >= start or until <= since:
        return cost
    return cost * (until - start) / (until - since)


def month(now: float | None = None) -> dict[str, Any]:
    """This month's total so far, with the clusters it counts and those whose price is unknown."""
    now = time.time() if now is None else now
    start = month_start(now)
    store = ClusterStore()
    total, counted, unpriced = 0.0, [], []
    for record in store.all():
        cost = cost_so_far(record, now)
        if cost is None:
            unpriced.append(record.name)
            continue
        total += _within(cost, record.launched_at, now, start)
        counted.append(record.name)
    ended = [e for e in store.events(since=start) if e.kind == "down" and e.cost is not None]
    for event in ended:
        total += _within(event.cost or 0.0, event.since or event.at, event.at, start)
    return {"month": time.strftime("%Y-%m", time.localtime(now)), "total": round(total, 4),
            "clusters": counted, "ended": len(ended), "unpriced": unpriced}


def managed_cost(cluster: str | None, submitted: float, live: ClusterRecord | None) -> float | None:
    """What managed job's clusters (named ``cluster``) cost since it was submitted: those ended
    (their ``down`` events) and ``live``, the one it has now. None where no price is known."""
    if cluster is None:
        return None
    downs: list[Event] = [e for e in ClusterStore().events(cluster, since=submitted)
                          if e.kind == "down" and e.cost is not None]
    now = cost_so_far(live) if live is not None else None
    if now is None and not downs:
        return None
    return round(sum(e.cost or 0.0 for e in downs) + (now or 0.0), 4)
