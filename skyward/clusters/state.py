"""The clusters this machine knows: records in SQLite, and who holds each one right now.

Everything lives under :func:`skyward._home.home` (``$SKYWARD_HOME``, default ``~/.skyward``,
mode 0700):

* ``state.db``: one row per named cluster (:class:`ClusterRecord`, its fields as columns for
  the ones ``skyward status`` shows and a pickle of the whole record). SQLite's own locking
  makes concurrent CLI commands safe; every access is one short transaction in WAL mode. The
  database is made ready (WAL mode, the table) once, by the first process to open it, under
  ``state.db.lock``; an access waits for the others (SQLite's busy wait) and, on "database is
  locked" (some waits skip the busy wait), is tried again with a growing pause for up to two
  minutes, so many clients starting at once never fail on one another
  (``tests/faults/test_state.py``).
* ``state.db``'s ``events``: what happened to each cluster (:class:`Event`: launched, nodes
  added or lost and why, attaches and detaches, autostop, stop, start, down, a managed job's
  recovery), written by the command or client that did it or saw it, in the same short
  transactions; the last :data:`EVENTS_KEPT` per cluster name are kept (those of a cluster ended
  stay, so a name's history reads across its launches), none older than :data:`EVENTS_DAYS` days.
* ``clusters/<name>.lock``: held (``flock``) by the one client attached to the cluster, or
  provisioning it, for as long as it is; the file says which process and host. The kernel
  releases it when that process ends, however it ends, so a killed client never leaves a
  stale lock: the next client simply takes it.

No secret is stored: the record holds the provider (how to reach the machines: addresses,
key *paths*, region), the shape, and hashes of the image and setup, never an image's env.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pickle
import socket
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from skyward._home import home
from skyward._retry import Backoff, retry
from skyward.errors import ClusterBusy, ConfigError

if TYPE_CHECKING:
    from skyward.image import Image
    from skyward.providers.base import Instance, Provider

__all__ = ["ClusterRecord", "ClusterStore", "Event", "cost_so_far", "hold", "note"]

UP, STOPPED, INIT = "UP", "STOPPED", "INIT"
T = TypeVar("T")
#: ``PRAGMA user_version`` of a database made ready (WAL, the tables): set once, at creation
#: (2: the events table, added to a database of version 1 by the first access that finds it).
SCHEMA = 2
#: How many events are kept per cluster name, and for how many days at most.
EVENTS_KEPT = 200
EVENTS_DAYS = 62
#: How long one access waits for the others: SQLite's own busy wait per attempt, then attempts
#: again on "database is locked" (some waits, a journal mode change, do not use the busy wait).
BUSY_TIMEOUT = 10.0
CONTENTION = Backoff(timeout=120.0, delay=0.02, factor=2.0, max_delay=1.0)


def check_name(name: object) -> str:
    """A cluster name: letters, digits, '-', '_' and '.', starting with a letter or digit."""
    import re

    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}", name):
        raise ConfigError("name", "a cluster name: letters, digits, '-', '_' or '.', starting with a letter "
                                  "or digit, at most 63 characters", name)
    return name


@dataclass(frozen=True)
class ClusterRecord:
    """What this machine remembers of one named cluster."""

    name: str
    id: str  # short hex: socket paths and cloud tags
    provider: Provider  # (pickled with the record)
    provider_name: str
    nodes: int
    processes: int
    concurrency: int
    executor: str
    accelerator: str | None
    instances: tuple[Instance, ...] = ()
    #: Per node: the Python that runs the cluster's workers and bridges, and the socket root.
    pythons: tuple[str, ...] = ()
    roots: tuple[str, ...] = ()
    image_hash: str = ""
    setup_hash: str | None = None  # (skyward launch -c) the setup block last run
    #: (skyward launch -c, exec) where the last workdir synced to it is on the nodes; later runs
    #: without a workdir of their own start there, as SkyPilot's do.
    workdir: str | None = None
    status: str = INIT
    idle_minutes: float | None = None
    down: bool = False
    launched_at: float = field(default_factory=time.time)
    #: What all its machines cost per hour as rented (their provider's prices; None: unknown or free).
    price_per_hour: float | None = None
    task_id: str = ""
    pool_id: str = ""  # the id of the pool that created it (cloud tags)
    #: The image its workers run, without secrets (new workers after autostop use it).
    image: Image | None = None
    #: (pid, tree tag) of each worker process by global rank, once started.
    workers: tuple[tuple[int, str], ...] = ()

    def socket(self, rank: int) -> str:
        node = rank // self.processes
        return f"{self.roots[node]}/c/{self.id}/{rank}.sock"

    def with_(self, **changes: Any) -> ClusterRecord:
        return replace(self, **changes)

    @property
    def resources(self) -> str:
        per = f"{self.accelerator}" if self.accelerator else "cpu"
        return f"{self.nodes}x {per}" + (f", {self.processes} proc/node" if self.processes > 1 else "")

    @property
    def autostop(self) -> str:
        if self.idle_minutes is None:
            return "-"
        return f"{self.idle_minutes:g}m" + (" (down)" if self.down else "")  # (SkyPilot's: 10m (down))


class ClusterStore:
    """The records (``state.db``); every method is one short transaction."""

    def __init__(self, path: Path | None = None):
        self.path = path or home() / "state.db"

    def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn(db)`` in one write transaction; tried again while other processes hold the database."""
        return retry(lambda: self._once(fn), CONTENTION, on=sqlite3.OperationalError,
                     giveup=lambda exc: not _contended(exc))

    def _once(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        db = self._connect()
        try:
            if db.execute("PRAGMA user_version").fetchone()[0] < SCHEMA:
                db.close()
                self._create()
                db = self._connect()
            db.execute("BEGIN IMMEDIATE")
            try:
                result = fn(db)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
            return result
        finally:
            db.close()

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT, isolation_level=None)
        with contextlib.suppress(OSError):
            os.chmod(self.path, 0o600)
        return db

    def _create(self) -> None:
        """Make the database ready, once: WAL mode and the table. One process at a time does it
        (a lock file beside the database), and only if no other did it first."""
        fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            db = self._connect()
            try:
                if db.execute("PRAGMA user_version").fetchone()[0] < SCHEMA:
                    db.execute("PRAGMA journal_mode=WAL")
                    db.execute("CREATE TABLE IF NOT EXISTS clusters (name TEXT PRIMARY KEY, status TEXT NOT NULL, "
                               "provider TEXT NOT NULL, updated REAL NOT NULL, record BLOB NOT NULL)")
                    db.execute("CREATE TABLE IF NOT EXISTS events (id INTEGER PRIMARY KEY AUTOINCREMENT, "
                               "cluster TEXT NOT NULL, at REAL NOT NULL, kind TEXT NOT NULL, text TEXT NOT NULL, "
                               "cost REAL, since REAL)")
                    db.execute("CREATE INDEX IF NOT EXISTS events_by_cluster ON events (cluster, id)")
                    db.execute(f"PRAGMA user_version = {SCHEMA}")
            finally:
                db.close()
        finally:
            os.close(fd)  # (releases the lock)

    def get(self, name: str) -> ClusterRecord | None:
        row = self._run(lambda db: db.execute("SELECT record FROM clusters WHERE name = ?", (name,)).fetchone())
        return pickle.loads(row[0]) if row else None

    def all(self) -> list[ClusterRecord]:
        rows = self._run(lambda db: db.execute("SELECT record FROM clusters ORDER BY name").fetchall())
        records = []
        for (blob,) in rows:
            with contextlib.suppress(Exception):  # a record this version cannot read is skipped
                records.append(pickle.loads(blob))
        return records

    def put(self, record: ClusterRecord, event: tuple[str, str] | None = None) -> None:
        """Write ``record``; with ``event`` (kind, text), that event of its timeline too, in the
        same transaction (one write to the disk, where an attach used to wait for two)."""
        blob = pickle.dumps(record)

        def write(db: sqlite3.Connection) -> None:
            db.execute("INSERT OR REPLACE INTO clusters (name, status, provider, updated, record) VALUES (?, ?, ?, ?, ?)",
                       (record.name, record.status, record.provider_name, time.time(), blob))
            if event is not None:
                _add_event(db, record.name, *event)

        self._run(write)

    def remove(self, name: str) -> None:
        self._run(lambda db: db.execute("DELETE FROM clusters WHERE name = ?", (name,)))

    def note(self, name: str, kind: str, text: str, ended: ClusterRecord | None = None,
             at: float | None = None) -> None:
        """Add an event to cluster ``name``'s timeline, at ``at`` (seconds since the epoch; None,
        or a time to come by another machine's clock: now) (``ended``: the record of the cluster
        that ended, whose cost from launch to now the event keeps); older ones beyond those kept go."""
        cost = cost_so_far(ended) if ended is not None else None
        since = ended.launched_at if ended is not None else None

        self._run(lambda db: _add_event(db, name, kind, text, cost, since, at))

    def events(self, name: str | None = None, since: float = 0.0) -> list[Event]:
        """Cluster ``name``'s events (None: every cluster's) from ``since`` on, oldest first (by their
        time: an event written late, a spot notice a node heard while nothing watched, takes its
        place)."""
        where, args = ("cluster = ? AND at >= ?", (name, since)) if name is not None else ("at >= ?", (since,))
        rows = self._run(lambda db: db.execute(f"SELECT cluster, at, kind, text, cost, since FROM events WHERE {where} "
                                               "ORDER BY at, id", args).fetchall())
        return [Event(*row) for row in rows]


def _add_event(db: sqlite3.Connection, name: str, kind: str, text: str, cost: float | None = None,
               since: float | None = None, at: float | None = None) -> None:
    """Add an event to cluster ``name``'s timeline, at ``at`` (None, or a time to come: now), and
    drop those beyond what is kept."""
    now = time.time()
    db.execute("INSERT INTO events (cluster, at, kind, text, cost, since) VALUES (?, ?, ?, ?, ?, ?)",
               (name, now if at is None else min(at, now), kind, text, cost, since))
    db.execute("DELETE FROM events WHERE cluster = ? AND id <= (SELECT id FROM events WHERE cluster = ? "
               "ORDER BY id DESC LIMIT 1 OFFSET ?)", (name, name, EVENTS_KEPT))
    db.execute("DELETE FROM events WHERE at < ?", (now - EVENTS_DAYS * 86400,))


@dataclass(frozen=True)
class Event:
    """One thing that happened to a cluster, as its timeline shows it."""

    cluster: str
    at: float
    kind: str  # launch, node, attach, detach, autostop, stop, start, down, recovery, preempt
    text: str
    cost: float | None = None  # (a down: what the cluster cost from launch to its end)
    since: float | None = None  # (a down: when that cluster was launched)

    def as_dict(self) -> dict[str, Any]:
        return {"at": self.at, "kind": self.kind, "text": self.text}


def note(name: str, kind: str, text: str, ended: ClusterRecord | None = None, at: float | None = None) -> None:
    """:meth:`ClusterStore.note`, best effort: a timeline that cannot be written now never fails
    what it tells of (an attach, a down)."""
    with contextlib.suppress(sqlite3.Error, OSError):
        ClusterStore().note(name, kind, text, ended, at)


def note_preemption(name: str, node: int, kind: str, action: str | None, at: float, heard: float | None) -> None:
    """Put a spot notice that node ``node`` heard (``kind``, ``action``, ``at`` in seconds since
    the epoch) on cluster ``name``'s timeline, unless it is there already: the attached client
    and every cluster page that looks at the node hear the same notice (best effort, as
    :func:`note`). The event bears ``heard``, when the node's worker read the notice (None: now):
    one heard while no client was attached and no page looked is written at the next attach or
    look, and still says when it came."""
    when = datetime.fromtimestamp(at, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    text = f"node {node}: spot " + (f"interruption notice: the machine will {action} at {when}"
                                    if kind == "interruption" else
                                    f"{kind} recommendation at {when}: the machine is at elevated risk of interruption")
    with contextlib.suppress(sqlite3.Error, OSError):
        if all(e.text != text for e in ClusterStore().events(name) if e.kind == "preempt"):
            note(name, "preempt", text, at=heard)


def cost_so_far(record: ClusterRecord, until: float | None = None) -> float | None:
    """What ``record``'s cluster has cost from its launch to ``until`` (now), at its machines'
    price; None where no price is known."""
    if record.price_per_hour is None:
        return None
    return round(record.price_per_hour * max(0.0, (until or time.time()) - record.launched_at) / 3600, 4)


@dataclass(frozen=True)
class Holder:
    pid: int
    host: str


@contextlib.contextmanager
def hold(name: str, what: str = "attached", wait: float = 0.0) -> Iterator[None]:
    """Hold cluster ``name`` for this process while the block runs; raise :class:`ClusterBusy`
    naming the holder if another live process holds it: at once, or (``wait`` seconds) if it
    still does then."""
    directory = home() / "clusters"
    directory.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(directory / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        for _ in Backoff(timeout=wait, delay=0.05, max_delay=1.0):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                continue
        else:
            holder = _read_holder(fd)
            raise ClusterBusy(name, holder.pid if holder else None, holder.host if holder else None)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()} {what}\n".encode(), 0)
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # (releases the lock)


def _contended(exc: BaseException) -> bool:
    """An SQLite error that means another connection holds the database (try again), not a fault."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def _read_holder(fd: int) -> Holder | None:
    try:
        text = os.pread(fd, 200, 0).decode()
        pid, host = text.split()[:2]
        return Holder(int(pid), host)
    except (OSError, ValueError):
        return None
