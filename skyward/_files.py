"""Writing a file so that readers only ever see it whole."""

from __future__ import annotations

import contextlib
import os
import tempfile


def write_atomically(path: str | os.PathLike[str], data: bytes, mode: int | None = None) -> None:
    """Write ``data`` to a temporary file beside ``path`` and rename it into place. ``mode``,
    when given, is the file's mode before any byte is written (whatever the umask)."""
    directory, name = os.path.split(os.fspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory or ".", prefix=f".{name}.", suffix=".part")
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
