"""Getting a launch's files onto its nodes: buckets copied or mounted, local file mounts and the
workdir packed and unpacked, a git workdir cloned (see :mod:`skyward.launch`).

Every copy runs as a task on the pool, so it uses the pool's connection and nothing else; on
the Local provider, whose nodes share this machine, each is done once. A bucket mounted for a
task is unmounted by :func:`unmount_all` when the task ends, on every exit path.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import IO, Any

from skyward.errors import ConfigError


__all__ = ["MAX_WORKDIR_BYTES", "sync_files", "unmount_all"]

#: Refuse to pack a workdir larger than this (it travels in one message to every node).
MAX_WORKDIR_BYTES = 256 << 20
_SKIP = frozenset({".git", "__pycache__", ".mypy_cache", ".pytest_cache", ".venv", "node_modules"})


def sync_files(pool: Any, p: Any, mounted: list[str], err: IO[str],
               only: frozenset[int] | None = None) -> str | None:
    """Copy (or mount) the buckets, copy the file mounts and the workdir to the nodes; returns
    the run's directory there (without a workdir: this directory on the Local provider, the
    home directory elsewhere). Every bucket mounted is added to ``mounted``.

    ``only``: the nodes that need them (replacements, for job recovery); the others are left as
    they are. On Local a replacement is this machine, which has them already."""
    from skyward._shell import shell
    from skyward.compute import compute
    from skyward.launch.taskfile.mounts import clone_command
    from skyward.launch.taskfile.stores import fetch_bucket, fetch_store, mount_store

    local = pool.provider.name == "local"
    if only is not None and local:
        return _run_directory(pool, p, local)

    def on_nodes(name: str, fn: Any, *args: Any) -> Any:
        if only is None:
            return compute(name=name)(fn)(*args)
        return compute(name=name)(_on_nodes)(sorted(only), fn, *args)

    for bucket in p.buckets:
        task: Any
        if bucket.mode != "COPY":
            task = on_nodes("mount bucket", mount_store, bucket.where, bucket.dest)
        elif bucket.where.scheme == "s3":
            task = on_nodes("copy bucket", fetch_bucket, bucket.url, bucket.dest)
        else:
            task = on_nodes("copy bucket", fetch_store, bucket.where, bucket.dest)
        if bucket.mode != "COPY" and bucket.dest not in mounted:  # before it runs: a node that mounts
            mounted.append(bucket.dest)                            # it before another fails is undone too
        used = [task >> pool] if local else task @ pool
        if "copied" in used:
            nodes = "this machine" if local else f"{used.count('copied')} of {len(used)} node(s)"
            tools = ", ".join(bucket.where.store.mount_tools) or "none for this store"
            err.write(f"skyward: file_mounts[{bucket.dest!r}]: {bucket.url} copied, not mounted, on {nodes} "
                      f"(no mount tool: {tools}); what the task writes there is not uploaded\n")
    for dest, source in p.file_mounts.items():
        blob = _pack(source, f"file_mounts[{dest!r}]")
        task = on_nodes("unpack files", _unpack_here, blob, dest, os.path.isdir(source))
        if local:
            task >> pool  # the nodes are this machine: once is enough
        else:
            task @ pool
    if p.workdir_git is not None:  # each node clones (on Local, once: the nodes share this machine)
        from skyward.launch.recovery import only_on

        command = clone_command(*p.workdir_git, f"~/.skyward/workdirs/{pool.task_id}")
        clone = shell(command if only is None else only_on(only, command), env=p.env)
        if local:
            clone >> pool
        else:
            clone @ pool
    elif p.workdir is not None and not local:
        on_nodes("unpack files", _unpack_here, _pack(p.workdir, "workdir"),
                 f"~/.skyward/workdirs/{pool.task_id}", True) @ pool
    return _run_directory(pool, p, local)


def _run_directory(pool: Any, p: Any, local: bool) -> str | None:
    """Where setup and run start on the nodes."""
    if p.workdir_git is not None or (p.workdir is not None and not local):
        return f"~/.skyward/workdirs/{pool.task_id}"
    if p.workdir is None:
        return None if local else "~"  # (elsewhere the worker's directory is skyward's own)
    return p.workdir


def _on_nodes(nodes: list[int], fn: Any, *args: Any) -> Any:
    """On a node: ``fn(*args)`` if this node is one of ``nodes``, else nothing (None)."""
    from skyward.runtime import instance_info

    return fn(*args) if instance_info().node in nodes else None


def unmount_all(pool: Any, mounted: list[str], err: IO[str]) -> None:
    """Undo the task's mounts on every node (on Local, once), on every exit path; a node that
    cannot is named, and the pool's teardown goes on."""
    from skyward.compute import compute
    from skyward.launch.taskfile.stores import unmount

    for dest in mounted:
        task = compute(name="unmount bucket")(unmount)(dest)
        try:
            task >> pool if pool.provider.name == "local" else task @ pool
        except Exception as exc:  # noqa: BLE001 - teardown continues; the user is told
            err.write(f"skyward: could not unmount {dest}: {exc}\n")


def _pack(source: str, what: str) -> bytes:
    import tarfile  # (here: a run with no files to send, `exec NAME 'cmd'`, loads none of it)

    buffer = io.BytesIO()
    size = 0
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        root = Path(source)
        paths = [root] if root.is_file() else sorted(root.rglob("*"))
        for path in paths:
            if any(part in _SKIP for part in path.relative_to(root.parent if root.is_file() else root).parts):
                continue
            if path.is_file() and not path.is_symlink():
                size += path.stat().st_size
                if size > MAX_WORKDIR_BYTES:
                    raise ConfigError(what, f"a directory of at most {MAX_WORKDIR_BYTES >> 20} MiB", source)
                arcname = path.name if root.is_file() else str(path.relative_to(root))
                tar.add(path, arcname=arcname, recursive=False)
    return buffer.getvalue()


def _unpack_here(blob: bytes, dest: str, is_dir: bool) -> str:
    """On a node: write the packed files under ``dest`` (a directory, or the file itself),
    each file atomically, so two nodes sharing a home directory never see half a file."""
    import tarfile
    import tempfile

    target = Path(os.path.expandvars(os.path.expanduser(dest)))
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        for member in tar.getmembers():
            if not member.isfile():
                continue
            out = target / member.name if is_dir else target
            out.parent.mkdir(parents=True, exist_ok=True)
            data = tar.extractfile(member).read()  # type: ignore[union-attr]
            fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, member.mode & 0o777)
            os.replace(tmp, out)
    return str(target)
