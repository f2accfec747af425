"""Which processes belong to a process group (Linux /proc), for confirming that none is left."""

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
