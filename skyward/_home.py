"""Where Skyward keeps what this machine must remember: ``$SKYWARD_HOME``, default ``~/.skyward``.

One definition for every part that writes there (the clusters' state, the pools' keys, the
catalog cache), so that they all agree on the folder: ``~`` in the variable is expanded, and the
folder is made, readable by its owner only (mode 0700), the first time it is asked for.
Standard library only: any layer may import it.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["home"]


def home() -> Path:
    """``$SKYWARD_HOME`` (``~`` expanded), or ``~/.skyward``; made (mode 0700) if missing."""
    path = Path(os.environ.get("SKYWARD_HOME") or "~/.skyward").expanduser()
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path
