"""A task's ``workdir`` and ``file_mounts``: ``${VAR}`` substitution, local paths and S3 buckets.

SkyPilot substitutes the task's ``envs`` into ``workdir`` and ``file_mounts`` (``$VAR`` and
``${VAR}``; a name that is not in ``envs`` stays as written), so :func:`resolve` runs once the
command line's ``--env`` overrides are in. Then:

* a local source (a file or a directory) must exist; it is copied to every node;
* a bucket URL (``s3://``, ``gs://``, ``r2://``, ... see :mod:`skyward.launch.taskfile.stores`), or an
  entry ``{source, name, store, mode}``, is a :class:`BucketMount`: every node copies it before
  setup, S3 with boto3 (its own credentials, and ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``
  where set), other stores with the store's command-line tool. ``mode: MOUNT`` mounts it where
  the node has a mount tool, and copies it otherwise (one warning line in the plan: what the
  task writes there is then not uploaded).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skyward.errors import ConfigError
from skyward.launch.taskfile.check import Findings
from skyward.launch.taskfile.stores import STORE_NAMES, STORES, Bucket, is_store_url, parse

__all__ = ["BucketMount", "clone_command", "resolve", "substitute"]

_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_STORAGE_KEYS = ("_bucket_sub_path", "_force_delete", "_is_sky_managed", "config", "mode", "mount_options", "name",
                 "persistent", "source", "store", "type")
_MODES = ("copy", "mount", "mount_cached")


@dataclass(frozen=True)
class BucketMount:
    """A bucket URL (any store :mod:`skyward.launch.taskfile.stores` knows) copied, or mounted (``mode``
    MOUNT or MOUNT_CACHED), at ``dest`` on every node."""

    dest: str
    url: str
    mode: str = "COPY"

    @property
    def where(self) -> Bucket:
        return parse(self.url)

    @property
    def bucket(self) -> str:
        return self.where.bucket

    @property
    def prefix(self) -> str:
        return self.where.prefix

    def describe(self) -> str:
        """How the nodes get it, in a plan's words."""
        store = self.where.store
        tools = "boto3" if store.scheme == "s3" else _either(store.copy_tools)
        if self.mode == "COPY":
            return f"copied with {tools} on every node"
        if not store.mount_tools:
            return f"copied with {tools} on every node ({store.title} is not mounted)"
        return f"mounted with {_either(store.mount_tools)}, whichever the node has; copied with {tools} where it has none"


def _placeholder(text: str) -> str:
    """Why a source is missing, where the file says so: ``<bucket-path>`` is for the user to fill in."""
    return "the task file holds a placeholder for you to fill in" if re.fullmatch(r"<[^<>]+>", text) else ""


def _either(tools: tuple[str, ...]) -> str:
    return tools[0] if len(tools) == 1 else ", ".join(tools[:-1]) + " or " + tools[-1]


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
                local.update(bucket)
            continue
        if not isinstance(source, str) or not source.strip():
            found.problem(at, "a local path, a bucket URL, or a mapping {source, name, store, mode}", source)
            continue
        text = substitute(source.strip(), envs)
        if is_store_url(text):
            bucket = _bucket(text, dest, "COPY", found, at)
            if bucket is not None:
                buckets.append(bucket)
        elif not Path(text).expanduser().exists():
            found.problem(at, "a local path that exists", text, _placeholder(text))
        else:
            local[dest] = str(Path(text).expanduser().resolve())
    return resolved_workdir, local, tuple(buckets)


def _bucket(url: str, dest: str, mode: str, found: Findings, at: str) -> BucketMount | None:
    try:
        where = parse(url)
    except ConfigError as exc:
        found.problem(at, exc.accepted, url)
        return None
    if mode != "COPY" and not where.store.mount_tools:
        found.warn(at, f"mode {mode} is copied (COPY): Skyward mounts no {where.store.title}; the files reach "
                       "the node once, and what the task writes there is not uploaded")
    elif mode != "COPY":
        found.warn(at, f"mode {mode}: mounted where the node has {_either(where.store.mount_tools)}; a node "
                       "with none copies it, and then what the task writes there is not uploaded")
    return BucketMount(dest, where.url, mode)


def _storage(entry: Mapping[str, Any], dest: str, envs: Mapping[str, str], found: Findings,
             at: str) -> BucketMount | dict[str, str] | None:
    """A storage entry: a bucket, or the local sources copied to the nodes directly."""
    for key in entry:
        if key not in _STORAGE_KEYS:
            found.unknown(f"{at}.", key, [k for k in _STORAGE_KEYS if not k.startswith("_")])
    store = entry.get("store")
    store = substitute(str(store), envs).lower() if store is not None else None
    mode = str(entry.get("mode") or "MOUNT").lower()
    if mode not in _MODES:
        found.problem(f"{at}.mode", "COPY, MOUNT or MOUNT_CACHED", entry.get("mode"))
        return None
    if store is not None and store not in STORE_NAMES:
        found.problem(f"{at}.store", "one of " + ", ".join(STORE_NAMES), store,
                      "SkyPilot's volumes and VAST Data are not stores Skyward reads" if store in ("volume", "vastdata")
                      else "")
        return None
    source = entry.get("source")
    name = entry.get("name")
    if isinstance(source, list):  # local paths, each in the bucket's root under its own name
        paths = [substitute(str(item), envs).strip() for item in source]
        if not paths or any(is_store_url(text) for text in paths):
            found.problem(f"{at}.source", "one bucket URL, or local paths (one or a list)", source)
            return None
        missing = [text for text in paths if not Path(text).expanduser().exists()]
        for text in missing:
            found.problem(f"{at}.source", "a local path that exists", text, _placeholder(text))
        if missing:
            return None
        found.warn(at, "the local sources are copied to every node directly, each under its own name (no bucket "
                       "is made for them)")
        return {f"{dest.rstrip('/')}/{Path(text).expanduser().resolve().name}": str(Path(text).expanduser().resolve())
                for text in paths}
    if source is not None:
        text = substitute(str(source), envs).strip()
        if is_store_url(text):
            return _bucket(text, dest, mode.upper(), found, f"{at}.source")
        if not Path(text).expanduser().exists():
            found.problem(f"{at}.source", "a local path that exists", text, _placeholder(text))
            return None
        found.warn(at, "the local source is copied to every node directly (no bucket is made for it)")
        return {dest: str(Path(text).expanduser().resolve())}
    if not isinstance(name, str) or not name.strip():
        found.problem(f"{at}.name" if "name" in entry else at, "a `source` (a bucket URL or a local path) or the "
                      "`name` of a bucket", name if "name" in entry else dict(entry),
                      "the task file leaves the bucket's name for you to fill in" if "name" in entry else "")
        return None
    bucket = substitute(name, envs).strip()
    if "$" in bucket:
        found.problem(f"{at}.name", "a bucket name (its variables set in envs or with --env)", bucket)
        return None
    scheme = STORE_NAMES[store or "s3"]
    if scheme in ("az", "cos"):
        form = "https://ACCOUNT.blob.core.windows.net/CONTAINER" if scheme == "az" else "cos://REGION/BUCKET"
        found.problem(f"{at}.name", f"a `source` URL ({form}) for {STORES[scheme].title}", bucket,
                      "a name alone does not say where the bucket is")
        return None
    return _bucket(f"{scheme}://{bucket}", dest, mode.upper(), found, at)


def clone_command(url: str, ref: str | None, dest: str) -> str:
    """Shell code cloning ``url`` into ``dest`` on a node (``~`` is the node's home), at ``ref``
    (the default branch when None). A clone already there (a named cluster's, from an earlier
    ``--git-url``) is fetched again and moved to ``ref``, as SkyPilot's re-launch and exec do:
    a branch to the remote's tip, a tag or a commit detached."""
    where = dest.replace("~", "$HOME", 1) if dest.startswith("~") else shlex.quote(dest)
    repo, want = f"git -C \"{where}\"", shlex.quote(ref or "")
    fresh = f"git clone --quiet {shlex.quote(url)} \"{where}\""
    if ref:
        fresh += f" && {repo} checkout --quiet {want}"
    again = (f"{repo} remote set-url origin {shlex.quote(url)} && {repo} fetch --quiet --force --tags --prune origin"
             f" && r={want} && if [ -z \"$r\" ]; then {repo} remote set-head origin --auto >/dev/null"
             f" && r=$({repo} symbolic-ref --short refs/remotes/origin/HEAD) && r=${{r#origin/}}; fi"
             f" && if {repo} rev-parse --verify --quiet \"refs/remotes/origin/$r\" >/dev/null;"
             f" then {repo} checkout --quiet --force -B \"$r\" \"origin/$r\";"
             f" else {repo} checkout --quiet --force --detach \"$r\"; fi")
    return f"if [ -d \"{where}/.git\" ]; then {again}; else {fresh}; fi"
