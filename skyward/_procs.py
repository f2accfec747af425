"""Reading Linux /proc: which processes there are, their parents and groups, for confirming
that none of a tree is left. The one place skyward reads ``/proc/<pid>/stat``.

Standard library only, and nothing of skyward: the command guardian
(``runtime/_reaper.py``, a script run with ``python -I -S``) loads this file by its path.
Every function copes with processes that end while it reads (and with no /proc at all)."""

from __future__ import annotations

import os


class Proc:
    """One process as ``/proc/<pid>/stat`` shows it."""

    __slots__ = ("pid", "state", "ppid", "pgrp")

    def __init__(self, pid: int, state: bytes, ppid: int, pgrp: int):
        self.pid = pid
        self.state = state  # b"R", b"S", b"Z" (a zombie: ended, not yet collected)...
        self.ppid = ppid
        self.pgrp = pgrp

    @property
    def zombie(self) -> bool:
        return self.state == b"Z"


def stat(pid: int) -> Proc | None:
    """Process ``pid``; None once it is gone (or where /proc can't be read)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            # The command name, in parentheses, may hold spaces and ")": split after the last.
            fields = f.read().rsplit(b")", 1)[1].split()
        return Proc(pid, fields[0], int(fields[1]), int(fields[2]))
    except (OSError, IndexError, ValueError):
        return None


def scan() -> list[Proc] | None:
    """Every process on the machine; None where /proc can't be read."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    found = []
    for entry in entries:
        if entry.isdigit():
            proc = stat(int(entry))
            if proc is not None:
                found.append(proc)
    return found


def cmdline(pid: int) -> bytes | None:
    """Process ``pid``'s command line (its arguments, each ended by a NUL); None once it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return None


def alive(pid: int) -> bool:
    """Process ``pid`` runs (it exists and is no zombie)."""
    proc = stat(pid)
    return proc is not None and not proc.zombie


def group_members(pgid: int) -> list[int] | None:
    """Live (non-zombie) processes in process group ``pgid``; None where /proc can't be read."""
    procs = scan()
    if procs is None:
        return None
    return [p.pid for p in procs if p.pgrp == pgid and not p.zombie]


def descendants(root: int, *, zombies: bool = True) -> list[int]:
    """Every process below ``root`` (by parent links), zombies included unless ``zombies`` is False."""
    children: dict[int, list[int]] = {}
    for p in scan() or ():
        if zombies or not p.zombie:
            children.setdefault(p.ppid, []).append(p.pid)
    found: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def zombie_children(parent: int) -> list[int]:
    """The ended, uncollected children of ``parent``."""
    return [p.pid for p in scan() or () if p.ppid == parent and p.zombie]


#: The variable every process of a worker's tree inherits (set by the transport that starts the
#: worker): teardown finds what the keeper could not clear by it (see :func:`tagged`).
TREE_VARIABLE = "SKYWARD_TREE"


def tagged(tag: str) -> list[int]:
    """Live processes whose environment holds ``SKYWARD_TREE=<tag>``: a worker's whole tree,
    detached processes included (a process started with an environment of its own is not)."""
    want = f"{TREE_VARIABLE}={tag}".encode()
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    me = os.getpid()
    for entry in entries:
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if want in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


class Trees:
    """One reading of /proc for confirming many workers' trees gone at once: the live
    processes of each process group, and of each ``SKYWARD_TREE`` tag."""

    __slots__ = ("groups", "tags", "readable")

    def __init__(self, groups: dict[int, list[int]], tags: dict[bytes, list[int]], readable: bool):
        self.groups = groups
        self.tags = tags
        self.readable = readable  # False: no /proc (nothing can be told from it)

    def left(self, pgid: int, tag: str) -> list[int]:
        return self.groups.get(pgid, []) + (self.tags.get(tag.encode(), []) if tag else [])


def _read_trees() -> Trees:
    prefix = f"{TREE_VARIABLE}=".encode()
    groups: dict[int, list[int]] = {}
    tags: dict[bytes, list[int]] = {}
    procs = scan()
    if procs is None:
        return Trees(groups, tags, False)
    me = os.getpid()
    for p in procs:
        if p.zombie or p.pid == me:
            continue
        groups.setdefault(p.pgrp, []).append(p.pid)
        try:
            with open(f"/proc/{p.pid}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        at = environ.find(prefix)
        while at > 0 and environ[at - 1] != 0:  # (not at a variable's start: look further)
            at = environ.find(prefix, at + 1)
        if at >= 0:
            end = environ.find(b"\0", at)
            tags.setdefault(environ[at + len(prefix):end if end >= 0 else None], []).append(p.pid)
    return Trees(groups, tags, True)


class SharedTrees:
    """:func:`_read_trees` for many threads at once: each caller gets a reading begun after it
    asked (so it sees every process that was there when it asked), and callers that ask
    together share one reading. A pool stopping 1,000 workers, each confirming its tree
    gone, reads /proc a few times instead of 1,000 (each reading costs O(processes))."""

    def __init__(self) -> None:
        import threading

        self._cond = threading.Condition()
        self._started = 0  # readings begun
        self._done = 0  # the number of the latest reading finished
        self._running = False
        self._latest: Trees | None = None

    def read(self) -> Trees:
        with self._cond:
            wanted = self._started + 1  # the first reading to begin after now
            while True:
                if self._done >= wanted and self._latest is not None:
                    return self._latest
                if not self._running:
                    self._running = True
                    self._started += 1
                    number = self._started
                    break
                self._cond.wait()
        trees = None
        try:
            trees = _read_trees()
            return trees
        finally:
            with self._cond:
                self._running = False
                if trees is not None:  # (one reading at a time: this is the latest begun)
                    self._done, self._latest = number, trees
                self._cond.notify_all()
