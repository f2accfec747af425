"""The clusters' state store (``state.db``) under contention: many processes opening it at once.

Each round has a ``SKYWARD_HOME`` of its own, its database either made while every process
opens it (``new``) or made before (``existing``). PROCESSES real processes (``spawn``),
released together by a barrier, each open the store, record a cluster of their own, attach to
it (hold it and record it UP), read it back and list every cluster. No call may fail
(``database is locked`` was seen when two ``ComputePool(name=...)`` started together), and
afterwards every record must be there.
``scripts/reliability.py`` puts the outcome on docs/reliability.md.
"""

from __future__ import annotations

import multiprocessing
import os
import traceback
from pathlib import Path

import pytest

PROCESSES = 16
#: Whether each round's database is made as the processes open it, or before; how many rounds.
#: (Before the fix, 9 runs of 10 of "new" with 50 rounds had a process fail, 2 to 19 times.)
ROUNDS = {"new": 80, "existing": 20}
CASES = tuple(ROUNDS)


def _client(index: int, base: str, rounds: int, barrier, results) -> None:
    """One process: each round, open the round's store, record, attach, read and list."""
    from skyward.clusters.state import UP, ClusterRecord, ClusterStore, hold

    errors: list[str] = []
    for round_ in range(rounds):
        os.environ["SKYWARD_HOME"] = os.path.join(base, f"round{round_}")
        name = f"c{index}"
        record = ClusterRecord(name=name, id=f"{index:04x}", provider="local", provider_name="local", nodes=1,
                               processes=1, concurrency=1, executor="thread", accelerator=None)
        try:
            barrier.wait(timeout=300)
            ClusterStore().put(record)
            with hold(name, "attached"):
                ClusterStore().put(record.with_(status=UP))
                got = ClusterStore().get(name)
                assert got is not None and got.status == UP, f"round {round_}: {name} read back as {got}"
                listed = {r.name for r in ClusterStore().all()}
                assert name in listed, f"round {round_}: {name} not in the list {sorted(listed)}"
        except BaseException:
            errors.append(f"process {index}, round {round_}:\n{traceback.format_exc()}")
    results.put((index, errors))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", CASES)
def test_many_processes_opening_the_state_at_once_all_succeed(case: str, tmp_path: Path) -> None:
    from skyward.clusters.state import UP, ClusterStore

    if case == "existing":
        for round_ in range(ROUNDS[case]):
            (tmp_path / f"round{round_}").mkdir()
            assert ClusterStore(tmp_path / f"round{round_}" / "state.db").all() == []
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    results = ctx.Queue()
    procs = [ctx.Process(target=_client, args=(i, str(tmp_path), ROUNDS[case], barrier, results))
             for i in range(PROCESSES)]
    for p in procs:
        p.start()
    try:
        reports = dict(results.get(timeout=540) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    failures = [e for i in sorted(reports) for e in reports[i]]
    assert not failures, (f"{len(failures)} of {PROCESSES * ROUNDS[case]} rounds of a process failed:\n"
                          + "\n".join(failures[:3]))
    for round_ in range(ROUNDS[case]):
        records = ClusterStore(tmp_path / f"round{round_}" / "state.db").all()
        assert sorted(r.name for r in records) == sorted(f"c{i}" for i in range(PROCESSES)), f"round {round_}"
        assert all(r.status == UP for r in records), f"round {round_}: {[(r.name, r.status) for r in records]}"
