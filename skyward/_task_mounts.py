"""A task's ``workdir`` and ``file_mounts``: ``${VAR}`` substitution, local paths and S3 buckets.

SkyPilot substitutes the task's ``envs`` into ``workdir`` and ``file_mounts`` (``$VAR`` and
``${VAR}``; a name that is not in ``envs`` stays as written), so :func:`resolve` runs once the
command line's ``--env`` overrides are in. Then:

* a local source (a file or a directory) must exist; it is copied to every node;
* an ``s3://bucket/prefix`` source, or an entry ``{source, name, store: s3, mode}``, is a
  :class:`BucketMount`: every node downloads it with boto3 (its own credentials, and
  ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` where set) before setup. ``mode: MOUNT`` is
  copied too, with one warning line: the files arrive once, and what the task writes there is
  not uploaded back;
* other stores (``gs://``, ``r2://``, Azure, ...) are refused, naming the source.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skyward._task_check import Findings

__all__ = ["BucketMount", "clone_command", "fetch_bucket", "resolve", "substitute"]

_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_STORAGE_KEYS = ("_bucket_sub_path", "_force_delete", "_is_sky_managed", "config", "mode", "mount_options", "name",
                 "persistent", "source", "store", "type")
_MODES = ("copy", "mount", "mount_cached")


@dataclass(frozen=True)
class BucketMount:
    """``s3://bucket/prefix`` copied to ``dest`` on every node (``mode`` as the file asked)."""

    dest: str
    url: str
    mode: str = "COPY"

    @property
    def bucket(self) -> str:
        return self.url[len("s3://"):].split("/", 1)[0]

    @property
    def prefix(self) -> str:
        rest = self.url[len("s3://"):].split("/", 1)
        return rest[1] if len(rest) > 1 else ""


def substitute(text: str, envs: Mapping[str, str]) -> str:
    """``$VAR`` and ``${VAR}`` replaced by ``envs``' values; other names left as written."""
    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return envs[name] if name in envs else match.group(0)

    return _VAR.sub(one, text)


def resolve(workdir: str | None, mounts: Mapping[Any, Any], envs: Mapping[str, str], found: Findings,
            where: str = "") -> tuple[str | None, dict[str, str], tuple[BucketMount, ...]]:
    """The workdir (absolute), local mounts ``{dest: absolute source}`` and bucket mounts."""
    resolved_workdir = None
    if workdir is not None:
        path = Path(substitute(workdir, envs)).expanduser()
        if not path.is_dir():
            found.problem(f"{where}workdir", "a local directory that exists", str(path))
        else:
            resolved_workdir = str(path.resolve())
    local: dict[str, str] = {}
    buckets: list[BucketMount] = []
    for raw_dest, source in mounts.items():
        at = f"{where}file_mounts[{raw_dest!r}]"
        if not isinstance(raw_dest, str) or not raw_dest.strip():
            found.problem(at, "a path on the node (a string)", raw_dest)
            continue
        dest = substitute(raw_dest, envs)
        if isinstance(source, Mapping):
            bucket = _storage(source, dest, envs, found, at)
            if isinstance(bucket, BucketMount):
                buckets.append(bucket)
            elif bucket is not None:
                local[dest] = bucket
            continue
        if not isinstance(source, str) or not source.strip():
            found.problem(at, "a local path, an s3:// URL, or a mapping {source, name, store, mode}", source)
            continue
        text = substitute(source.strip(), envs)
        if text.startswith("s3://"):
            buckets.append(BucketMount(dest, text.rstrip("/")))
        elif "://" in text:
            found.problem(at, "a local path or an s3:// URL", text,
                          f"{text.split('://')[0]}:// storage is not supported (Skyward copies from S3)")
        elif not Path(text).expanduser().exists():
            found.problem(at, "a local path that exists", text)
        else:
            local[dest] = str(Path(text).expanduser().resolve())
    return resolved_workdir, local, tuple(buckets)


def _storage(entry: Mapping[str, Any], dest: str, envs: Mapping[str, str], found: Findings,
             at: str) -> BucketMount | str | None:
    for key in entry:
        if key not in _STORAGE_KEYS:
            found.unknown(f"{at}.", key, [k for k in _STORAGE_KEYS if not k.startswith("_")])
    store = entry.get("store")
    store = substitute(str(store), envs).lower() if store is not None else None
    mode = str(entry.get("mode") or "MOUNT").lower()
    if mode not in _MODES:
        found.problem(f"{at}.mode", "COPY, MOUNT or MOUNT_CACHED", entry.get("mode"))
        return None
    if store not in (None, "s3"):
        found.problem(f"{at}.store", "s3 (Skyward copies from S3 buckets)", store)
        return None
    source = entry.get("source")
    name = entry.get("name")
    if isinstance(source, list):
        found.problem(f"{at}.source", "one local path or s3:// URL", source)
        return None
    if source is not None:
        text = substitute(str(source), envs).strip()
        if text.startswith("s3://"):
            url = text.rstrip("/")
        elif "://" in text:
            found.problem(f"{at}.source", "a local path or an s3:// URL", text,
                          f"{text.split('://')[0]}:// storage is not supported (Skyward copies from S3)")
            return None
        else:
            if not Path(text).expanduser().exists():
                found.problem(f"{at}.source", "a local path that exists", text)
                return None
            found.warn(at, "the local source is copied to every node directly (no bucket is made for it)")
            return str(Path(text).expanduser().resolve())
    elif isinstance(name, str) and name.strip():
        bucket = substitute(name, envs).strip()
        if "$" in bucket:
            found.problem(f"{at}.name", "a bucket name (its variables set in envs or with --env)", bucket)
            return None
        url = f"s3://{bucket}"
    else:
        found.problem(at, "a `source` (s3:// URL or local path) or the `name` of an S3 bucket", dict(entry))
        return None
    if mode != "copy":
        found.warn(at, f"mode {mode.upper()} is copied (COPY): the bucket's files reach the node once, and "
                       "what the task writes there is not uploaded")
    return BucketMount(dest, url, mode.upper())


def fetch_bucket(url: str, dest: str) -> int:
    """On a node: download ``s3://bucket/prefix`` to ``dest`` (a directory; a single object whose
    key is the prefix itself becomes the file ``dest``); returns the number of files written.

    boto3 finds the node's credentials and endpoint the usual way (environment, profile,
    instance role; ``AWS_ENDPOINT_URL_S3``)."""
    from skyward._optional import require
    from skyward.errors import SkywardError

    errors = require("botocore.exceptions", "file_mounts from S3")
    BotoCoreError, ClientError = errors.BotoCoreError, errors.ClientError  # noqa: N806
    try:
        return _fetch(url, dest)
    except (BotoCoreError, ClientError) as exc:  # a clear line, not botocore's traceback
        code = exc.response["Error"].get("Code", "") if isinstance(exc, ClientError) else type(exc).__name__
        raise SkywardError(f"file_mounts: could not copy {url} to {dest}: {code}: {exc}") from None


def _fetch(url: str, dest: str) -> int:
    from skyward._optional import require

    boto3 = require("boto3", "file_mounts from S3")

    bucket, _, prefix = url[len("s3://"):].partition("/")
    client = boto3.client("s3")
    target = Path(os.path.expanduser(dest))
    keys = [item["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            for item in page.get("Contents", ())]
    if prefix and keys == [prefix]:  # one object: the mount is that file
        target.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(bucket, prefix, str(target))
        return 1
    target.mkdir(parents=True, exist_ok=True)
    base = prefix if not prefix or prefix.endswith("/") else prefix + "/"
    written = 0
    for key in keys:
        if key.endswith("/") or (prefix and not key.startswith(base)):
            continue
        out = target / key[len(base):]
        out.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(bucket, key, str(out))
        written += 1
    return written


def clone_command(url: str, ref: str | None, dest: str) -> str:
    """Shell code cloning ``url`` into ``dest`` on a node (``~`` is the node's home), at ``ref``."""
    where = dest.replace("~", "$HOME", 1) if dest.startswith("~") else shlex.quote(dest)
    command = f"git clone --quiet {shlex.quote(url)} \"{where}\""
    if ref:
        command += f" && git -C \"{where}\" checkout --quiet {shlex.quote(ref)}"
    return command
