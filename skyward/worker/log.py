"""The worker side's one log line: ``[skyward.<who> <pid>] <message>`` on stderr (fd 2).

Written with one ``os.write`` (no buffer to flush, safe in a forked child and on the way out)
and never raising: a worker whose stderr is gone still ends as it should."""

from __future__ import annotations

import os


def log(message: str, who: str = "worker") -> None:
    """One line on stderr, tagged with ``who`` (worker, resident, keeper) and this process's id."""
    try:
        os.write(2, f"[skyward.{who} {os.getpid()}] {message}\n".encode())
    except OSError:
        pass
