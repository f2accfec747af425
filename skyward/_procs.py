"""Which processes belong to a process group, or lie below a process (Linux /proc), for
confirming that none is left. (``worker/_reaper.py`` keeps a copy of :func:`descendants`:
it runs as a stand-alone script that imports nothing of skyward.)"""

from __future__ import annotations

import os


def group_members(pgid: int) -> list[int] | None:
    """Live (non-zombie) processes in process group ``pgid``; None where /proc can't be read."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    members = []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != b"Z":
            members.append(int(entry))
    return members


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


def descendants(root: int) -> list[int]:
    """Every process below ``root`` (Linux /proc), zombies included."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found
