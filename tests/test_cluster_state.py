"""The clusters' state store and ``SKYWARD_HOME``: one folder for every part, and an access that
waits out another process's lock instead of failing. (Many processes at once:
tests/faults/test_state.py.)"""

from __future__ import annotations

import sqlite3
import stat
import threading
import time
from pathlib import Path

import pytest

from skyward.clusters import state
from skyward.clusters.state import ClusterRecord, ClusterStore
from skyward.providers.aws import catalog_cache, machines


def record(name: str) -> ClusterRecord:
    return ClusterRecord(name=name, id="ab12", provider="local", provider_name="local", nodes=1, processes=1,
                         concurrency=1, executor="thread", accelerator=None)


@pytest.mark.parametrize("value", ["~/x", "~/x/", "~/deeper/x"])
def test_skyward_home_with_a_tilde_is_one_folder_for_state_keys_and_catalog(
        value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("SKYWARD_HOME", value)
    expected = tmp_path / value[2:].rstrip("/")
    assert ClusterStore().path == expected / "state.db"
    assert catalog_cache.cache_path("us-east-1") == expected / "catalog" / "aws-us-east-1.json"
    assert machines.cluster_directory("pool1", create=True) == expected / "aws" / "pool1"
    assert stat.S_IMODE(expected.stat().st_mode) == 0o700
    ClusterStore().put(record("c1"))
    assert [r.name for r in ClusterStore().all()] == ["c1"]
    assert not (tmp_path / "~").exists(), "a folder named '~' was made"


def test_skyward_home_defaults_to_dot_skyward_in_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("SKYWARD_HOME", raising=False)
    assert catalog_cache.cache_path("eu-west-1").parent.parent == tmp_path / ".skyward"
    assert ClusterStore().path == tmp_path / ".skyward" / "state.db"
    assert stat.S_IMODE((tmp_path / ".skyward").stat().st_mode) == 0o700


def test_an_access_waits_out_a_lock_held_longer_than_the_busy_wait(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another connection holds the database past SQLite's busy wait: the access tries again."""
    store = ClusterStore(tmp_path / "state.db")
    store.put(record("first"))
    monkeypatch.setattr(state, "BUSY_TIMEOUT", 0.05)
    holder = sqlite3.connect(store.path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")
    released = threading.Timer(1.0, holder.execute, ("COMMIT",))
    released.start()
    started = time.monotonic()
    try:
        store.put(record("second"))
    finally:
        released.join()
        holder.close()
    assert time.monotonic() - started >= 0.9
    assert [r.name for r in store.all()] == ["first", "second"]


def test_a_database_fault_that_is_not_contention_is_raised_at_once(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    path.write_bytes(b"not a database at all, " * 100)
    started = time.monotonic()
    with pytest.raises(sqlite3.DatabaseError, match="not a database"):
        ClusterStore(path).all()
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(("idle", "down", "shown"), [(None, False, "-"), (1, False, "1m"), (10, True, "10m (down)"),
                                                     (0, True, "0m (down)"), (0.5, False, "0.5m")])
def test_the_autostop_column_is_written_as_skypilot_writes_it(idle: float | None, down: bool, shown: str) -> None:
    assert record("c").with_(idle_minutes=idle, down=down).autostop == shown


def test_a_cluster_keeps_its_last_events_and_a_down_keeps_what_the_cluster_cost(tmp_path: Path) -> None:
    store = ClusterStore(tmp_path / "state.db")
    for i in range(state.EVENTS_KEPT + 5):
        store.note("c1", "node", f"event {i}")
    store.note("c2", "attach", "<b>kept as text</b>")
    kept = store.events("c1")
    assert len(kept) == state.EVENTS_KEPT and kept[0].text == "event 5" and kept[-1].text == f"event {state.EVENTS_KEPT + 4}"
    assert [(e.kind, e.text) for e in store.events("c2")] == [("attach", "<b>kept as text</b>")]
    priced = record("c2").with_(price_per_hour=2.0, launched_at=time.time() - 1800)
    store.note("c2", "down", "ended", priced)
    down = store.events("c2")[-1]
    assert down.since == priced.launched_at and down.cost is not None and 0.99 < down.cost < 1.01
    assert store.events("c2", since=down.at) == [down] and store.events("nothing") == []


def test_a_state_database_of_before_events_gains_them_and_keeps_its_clusters(tmp_path: Path) -> None:
    import pickle

    path = tmp_path / "state.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE clusters (name TEXT PRIMARY KEY, status TEXT NOT NULL, provider TEXT NOT NULL, "
               "updated REAL NOT NULL, record BLOB NOT NULL)")
    db.execute("INSERT INTO clusters VALUES (?, ?, ?, ?, ?)", ("old", "UP", "local", time.time(),
                                                                pickle.dumps(record("old"))))
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()
    store = ClusterStore(path)
    assert store.events("old") == []
    store.note("old", "stop", "stopped")
    assert [e.text for e in store.events("old")] == ["stopped"]
    assert store.get("old") == record("old").with_(launched_at=store.get("old").launched_at)  # type: ignore[union-attr]


def test_a_record_and_an_event_of_its_timeline_are_written_together(tmp_path: Path) -> None:
    # (an attach writes both in one transaction: one write to the disk before its first task)
    store = ClusterStore(tmp_path / "state.db")
    store.put(record("c3").with_(status=state.UP), event=("attach", "a client attached"))
    assert store.get("c3").status == state.UP
    assert [(e.kind, e.text) for e in store.events("c3")] == [("attach", "a client attached")]
