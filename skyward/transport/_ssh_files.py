"""The host's files over SFTP, on the SSH transport's one connection: the login directory,
``~`` expansion, existence checks and whole-file writes (written aside, then renamed, with the
mode set before any byte is written). :class:`~skyward.transport.ssh.SSHTransport` delegates
its file operations here; the SFTP session opens on first use.
"""

from __future__ import annotations

import contextlib
import io
import threading
import uuid
from collections.abc import Callable
from typing import Any

__all__ = ["SFTPFiles"]


class SFTPFiles:
    """File operations on one host; ``open_sftp`` opens the SFTP session (connecting if need be)."""

    def __init__(self, open_sftp: Callable[[], Any]):
        self._open = open_sftp
        self._sftp: Any = None
        self._home: str | None = None
        self._lock = threading.Lock()

    def _sftp_client(self) -> Any:
        if self._sftp is None:
            self._sftp = self._open()
        return self._sftp

    def home(self) -> str:
        """The login directory on the host (absolute)."""
        if self._home is None:
            with self._lock:
                self._home = str(self._sftp_client().normalize("."))
        return self._home

    def expand(self, path: str) -> str:
        """``path`` with a leading ``~`` replaced by the login directory."""
        if path == "~":
            return self.home()
        if path.startswith("~/"):
            return self.home().rstrip("/") + path[1:]
        return path

    def exists(self, remote_path: str, size: int | None = None) -> bool:
        """True if ``remote_path`` exists (and has ``size`` bytes, when given)."""
        with self._lock:
            try:
                st = self._sftp_client().stat(self.expand(remote_path))
            except OSError:
                return False
        return size is None or st.st_size == size

    def put(self, local_path: str, remote_path: str, *, mode: int | None = None) -> None:
        """Copy a file; it appears at ``remote_path`` whole (written aside, then renamed)."""
        with open(local_path, "rb") as f:
            self._put(f, remote_path, mode)

    def put_bytes(self, data: bytes, remote_path: str, *, mode: int = 0o600) -> None:
        """Write ``data`` to ``remote_path``; the file has ``mode`` before any byte is written."""
        self._put(io.BytesIO(data), remote_path, mode)

    def _put(self, source: io.RawIOBase | io.BufferedIOBase | Any, remote_path: str, mode: int | None) -> None:
        remote = self.expand(remote_path)
        tmp = f"{remote}.{uuid.uuid4().hex[:8]}.part"
        with self._lock:
            sftp = self._sftp_client()
            try:
                with sftp.open(tmp, "wb") as f:
                    if mode is not None:
                        f.chmod(mode)  # before the content: a secret is never readable by others
                    f.set_pipelined(True)
                    while chunk := source.read(1024 * 1024):
                        f.write(chunk)
                try:
                    sftp.posix_rename(tmp, remote)
                except OSError:
                    with contextlib.suppress(OSError):
                        sftp.remove(remote)
                    sftp.rename(tmp, remote)
            except BaseException:
                with contextlib.suppress(Exception):
                    sftp.remove(tmp)
                raise

    def close(self) -> None:
        sftp, self._sftp = self._sftp, None
        with contextlib.suppress(Exception):
            if sftp is not None:
                sftp.close()
