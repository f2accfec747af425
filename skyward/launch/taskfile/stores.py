"""Buckets in every store a SkyPilot task file names, and how a node copies or mounts one.

A ``file_mounts`` source is a URL (``s3://``, ``gs://``, ``r2://``, ``nebius://``, ``cw://``,
``cos://REGION/``, ``oci://BUCKET[@REGION]``, ``https://ACCOUNT.blob.core.windows.net/CONTAINER``)
or a bucket ``name`` with a ``store``; :func:`parse` reads either into a :class:`Bucket`.

On the node (its own credentials, nothing is shipped from the client), S3 is copied with boto3
(:func:`fetch_bucket`) and every other store with the first command-line
tool of :attr:`Store.copy_tools` the node has, looked up on its ``PATH`` and in the worker's
environment (where :attr:`Store.pip` puts one on remote nodes). The profiles and endpoints are
SkyPilot's: R2 uses the AWS CLI profile ``r2`` and the endpoint of ``~/.cloudflare/accountid``,
Nebius the profile ``nebius``, CoreWeave ``cw``, IBM COS its region's public endpoint.

``mode: MOUNT`` mounts the bucket with the first of :attr:`Store.mount_tools` the node has
(FUSE), and :func:`unmount` undoes it when the task ends; a node with none copies instead, and
says so. Stores without mount tools here are always copied (one warning line in the plan).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from skyward.errors import ConfigError, FileMountError

__all__ = ["STORES", "STORE_NAMES", "Bucket", "Store", "copy_commands", "fetch_store", "find_tool",
           "mount_command", "mount_store", "parse", "unmount"]


@dataclass(frozen=True)
class Store:
    """One object store: its URL scheme, and the node tools that copy or mount it, in order."""

    scheme: str
    title: str
    copy_tools: tuple[str, ...]
    mount_tools: tuple[str, ...] = ()
    #: pip packages that bring the first copy tool into a remote worker's environment.
    pip: tuple[str, ...] = ()


STORES = {s.scheme: s for s in (
    Store("s3", "S3", ("boto3",), ("mount-s3", "goofys", "s3fs", "rclone"), ("boto3",)),
    Store("gs", "Google Cloud Storage", ("gcloud", "gsutil", "rclone"), ("gcsfuse", "rclone"), ("gsutil",)),
    Store("r2", "Cloudflare R2", ("aws",), (), ("awscli",)),
    Store("nebius", "Nebius Object Storage", ("aws",), (), ("awscli",)),
    Store("cw", "CoreWeave Object Storage", ("aws",), (), ("awscli",)),
    Store("cos", "IBM Cloud Object Storage", ("aws",), (), ("awscli",)),
    Store("oci", "OCI Object Storage", ("oci",), (), ("oci-cli",)),
    Store("az", "Azure Blob Storage", ("az",)),
)}
#: ``store:`` as a task file writes it -> the store's scheme.
STORE_NAMES = {"s3": "s3", "gcs": "gs", "r2": "r2", "nebius": "nebius", "coreweave": "cw", "ibm": "cos",
               "oci": "oci", "azure": "az"}
#: The tools :func:`copy_commands`, :func:`mount_command` and :func:`unmount` know.
COPY_TOOLS = ("rclone", "gcloud", "gsutil", "aws", "oci", "az")
MOUNT_TOOLS = ("mount-s3", "goofys", "s3fs", "gcsfuse", "rclone")
UNMOUNT_TOOLS = ("fusermount", "fusermount3", "umount")
_PROFILES = {"r2": "r2", "nebius": "nebius", "cw": "cw"}
_AZURE = re.compile(r"https://([a-z0-9]{3,24})\.blob\.core\.windows\.net/([^/]+)/?(.*)")


@dataclass(frozen=True)
class Bucket:
    """A place in a store: ``bucket`` and ``prefix`` (empty: the whole bucket); ``region`` for
    IBM COS and OCI, ``account`` for Azure (whose container is the bucket)."""

    scheme: str
    bucket: str
    prefix: str = ""
    region: str | None = None
    account: str | None = None

    @property
    def store(self) -> Store:
        return STORES[self.scheme]

    @property
    def url(self) -> str:
        rest = f"/{self.prefix}" if self.prefix else ""
        if self.scheme == "az":
            return f"https://{self.account}.blob.core.windows.net/{self.bucket}{rest}"
        if self.scheme == "cos":
            return f"cos://{self.region}/{self.bucket}{rest}"
        if self.scheme == "oci" and self.region:
            return f"oci://{self.bucket}@{self.region}{rest}"
        return f"{self.scheme}://{self.bucket}{rest}"


def is_store_url(text: str) -> bool:
    """Whether ``text`` names a bucket rather than a local path."""
    return "://" in text


def parse(url: str) -> Bucket:
    """``url`` -> :class:`Bucket`; :class:`~skyward.errors.ConfigError` (``file_mounts source``)
    saying what is accepted for anything else."""
    text = url.strip().rstrip("/")
    match = _AZURE.fullmatch(text)
    if match:
        return Bucket("az", match.group(2), match.group(3), account=match.group(1))
    scheme, sep, rest = text.partition("://")
    if not sep or scheme not in STORES or scheme == "az" or not rest:
        raise ConfigError(SOURCE, "a local path, or a bucket URL: " + ", ".join(_URL_FORMS), url)
    if scheme == "cos":
        place, _, rest = rest.partition("/")
        if not place or not rest:
            raise ConfigError(SOURCE, "cos://REGION/BUCKET[/PATH]", url)
        bucket, _, prefix = rest.partition("/")
        return Bucket("cos", bucket, prefix, region=place)
    bucket, _, prefix = rest.partition("/")
    region: str | None = None
    if scheme == "oci" and "@" in bucket:
        bucket, _, region = bucket.partition("@")
    return Bucket(scheme, bucket, prefix, region=region)


#: What :func:`parse`'s errors name as their parameter.
SOURCE = "file_mounts source"
_URL_FORMS = ("s3://", "gs://", "r2://", "nebius://", "cw://", "cos://REGION/", "oci://",
              "https://ACCOUNT.blob.core.windows.net/CONTAINER")


# -- on the node -----------------------------------------------------------------------------------


def find_tool(name: str) -> str | None:
    """``name`` on the node's PATH, or in the worker's own environment (where pip put it)."""
    return shutil.which(name) or shutil.which(name, path=os.path.dirname(sys.executable))


def copy_commands(b: Bucket, tool: str, dest: str) -> tuple[list[str] | None, list[str], list[str]]:
    """(a command whose success means ``b`` is one object, or None: never; the command copying
    that object to the file ``dest``; the command copying the prefix into the directory ``dest``)."""
    key = b.prefix
    if tool == "rclone":  # copyto takes a file or a directory alike
        return None, [], ["rclone", "copyto", f":gcs,env_auth=true:{b.bucket}/{key}", dest]
    if tool == "gcloud":
        return (["gcloud", "storage", "objects", "describe", b.url], ["gcloud", "storage", "cp", b.url, dest],
                ["gcloud", "storage", "rsync", "--recursive", b.url, dest])
    if tool == "gsutil":
        return (["gsutil", "-q", "stat", b.url], ["gsutil", "-q", "cp", b.url, dest],
                ["gsutil", "-m", "-q", "rsync", "-r", b.url, dest])
    if tool == "aws":
        extra = _aws_options(b)
        s3 = f"s3://{b.bucket}/{key}" if key else f"s3://{b.bucket}"
        return (["aws", "s3api", "head-object", "--bucket", b.bucket, "--key", key, *extra],
                ["aws", "s3", "cp", "--only-show-errors", s3, dest, *extra],
                ["aws", "s3", "sync", "--only-show-errors", s3, dest, *extra])
    if tool == "oci":
        region = ["--region", b.region] if b.region else []
        at = ["--bucket-name", b.bucket, *region]
        return (["oci", "os", "object", "head", *at, "--name", key], ["oci", "os", "object", "get", *at, "--name",
                key, "--file", dest],
                ["oci", "os", "object", "bulk-download", *at, "--download-dir", dest, *(["--prefix", key] if key else [])])
    if tool == "az":
        at = ["--account-name", str(b.account)]
        return (["az", "storage", "blob", "show", *at, "--container-name", b.bucket, "--name", key],
                ["az", "storage", "blob", "download", *at, "--container-name", b.bucket, "--name", key, "--file", dest],
                ["az", "storage", "blob", "download-batch", *at, "--source", b.bucket, "--destination", dest,
                 *(["--pattern", f"{key}/*"] if key else [])])
    raise ConfigError("tool", "one of " + ", ".join(COPY_TOOLS), tool)


def _aws_options(b: Bucket) -> list[str]:
    out = []
    if b.scheme in _PROFILES and "AWS_PROFILE" not in os.environ:
        out += ["--profile", _PROFILES[b.scheme]]
    account = Path("~/.cloudflare/accountid").expanduser()
    if b.scheme == "r2" and account.is_file():
        out += ["--endpoint-url", f"https://{account.read_text().strip()}.r2.cloudflarestorage.com"]
    if b.scheme == "cos":
        out += ["--endpoint-url", f"https://s3.{b.region}.cloud-object-storage.appdomain.cloud"]
    return out


def fetch_store(b: Bucket, dest: str) -> str:
    """On a node: copy ``b`` to ``dest`` (a file when ``b`` is one object, else a directory) with
    the first copy tool the node has; returns the tool used. Raises
    :class:`~skyward.errors.FileMountError` naming the tools when the node has none, or the tool's
    own last lines when it fails."""
    tools = b.store.copy_tools
    tool = next((t for t in tools if find_tool(t)), None)
    if tool is None:
        raise FileMountError("copy", b.url, dest, f"it needs {' or '.join(tools)} on the node, and the node has none",
                             tools=tools)
    target = os.path.expanduser(dest)
    check, one, many = copy_commands(b, tool, target)
    is_object = bool(b.prefix) and check is not None and _run(check, quiet=True) == 0
    Path(target).parent.mkdir(parents=True, exist_ok=True)
    if not is_object and tool != "rclone":
        Path(target).mkdir(parents=True, exist_ok=True)
    done = _run(one if is_object else many)
    if done:
        raise FileMountError("copy", b.url, dest, str(done), tool=tool, tools=tools)
    return tool


def mount_command(b: Bucket, tool: str, dest: str, endpoint: str | None = None) -> list[str]:
    """The command mounting ``b`` at ``dest`` with ``tool`` (it returns once mounted);
    ``endpoint``: an S3 endpoint other than AWS's."""
    key = b.prefix
    if tool == "mount-s3":
        return ["mount-s3", b.bucket, dest, *(["--prefix", key + "/"] if key else []),
                *(["--endpoint-url", endpoint] if endpoint else [])]
    if tool == "goofys":
        return ["goofys", *(["--endpoint", endpoint] if endpoint else []), f"{b.bucket}:{key}" if key else b.bucket,
                dest]
    if tool == "s3fs":
        options = ["-o", f"url={endpoint}", "-o", "use_path_request_style"] if endpoint else []
        return ["s3fs", f"{b.bucket}:/{key}" if key else b.bucket, dest, *options]
    if tool == "gcsfuse":
        return ["gcsfuse", *(["--only-dir", key] if key else []), b.bucket, dest]
    if tool == "rclone":
        backend = ":gcs,env_auth=true" if b.scheme == "gs" else \
            ":s3,provider=AWS,env_auth=true" + (f",endpoint='{endpoint}'" if endpoint else "")
        return ["rclone", "mount", "--daemon", f"{backend}:{b.bucket}/{key}", dest]
    raise ConfigError("tool", "one of " + ", ".join(MOUNT_TOOLS), tool)


def mount_store(b: Bucket, dest: str) -> str:
    """On a node: mount ``b`` at ``dest`` with the first mount tool the node has; a node with
    none copies it instead. Returns the tool ("copied" when it copied); raises
    :class:`~skyward.errors.FileMountError` when ``dest`` is a mount point already or the tool fails."""
    target = os.path.expanduser(dest)
    if os.path.ismount(target):  # (and the unmount at the end would take away what is there)
        raise FileMountError("mount", b.url, dest, f"{dest} is a mount point already; mounting {b.url} there "
                                                   "would hide it", tools=b.store.mount_tools)
    tool = next((t for t in b.store.mount_tools if find_tool(t)), None)
    if tool is None:
        if b.scheme == "s3":
            fetch_bucket(b.url, dest)
        else:
            fetch_store(b, dest)
        return "copied"
    Path(target).mkdir(parents=True, exist_ok=True)
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") \
        if b.scheme == "s3" else None
    failed = _run(mount_command(b, tool, target, endpoint))
    if failed:
        raise FileMountError("mount", b.url, dest, str(failed), tool=tool, tools=b.store.mount_tools)
    marker = _marker(target)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(target)
    return tool


def unmount(dest: str) -> bool:
    """On a node: undo the mount :func:`mount_store` made at ``dest``; False when it made none
    there (nothing else mounted at ``dest`` is ever touched). Raises
    :class:`~skyward.errors.FileMountError` when the mount stays."""
    target = os.path.expanduser(dest)
    marker = _marker(target)
    if not marker.is_file():
        return False
    for command in ([tool, "-u", target] if tool != "umount" else [tool, target] for tool in UNMOUNT_TOOLS):
        if not os.path.ismount(target) or (find_tool(command[0]) and _run(command, quiet=True) == 0):
            break
    marker.unlink()
    if os.path.ismount(target):
        raise FileMountError("unmount", "", dest, "it is still mounted: fusermount -u and umount both "
                                                           "failed", tools=UNMOUNT_TOOLS)
    return True


def _marker(target: str) -> Path:
    """What says this host mounted ``target`` for a task (per host: a home directory may be shared)."""
    import hashlib
    import socket

    digest = hashlib.sha256(target.encode()).hexdigest()[:16]
    return Path("~/.skyward/mounts").expanduser() / f"{socket.gethostname()}-{digest}"


def _run(command: list[str], *, quiet: bool = False) -> str | int:
    """0 when ``command`` succeeds; else its exit status (``quiet``) or its last output lines."""
    path = find_tool(command[0])
    try:
        done = subprocess.run([path or command[0], *command[1:]], capture_output=True, text=True, timeout=3600,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 1 if quiet else str(exc)
    if done.returncode == 0:
        return 0
    if quiet:
        return done.returncode
    tail = (done.stderr.strip() or done.stdout.strip()).splitlines()[-3:]
    return f"exit status {done.returncode}: " + " / ".join(tail)


# -- S3, with boto3 (on a node) -------------------------------------------------------------


def fetch_bucket(url: str, dest: str) -> int:
    """On a node: download ``s3://bucket/prefix`` to ``dest`` (a directory; a single object whose
    key is the prefix itself becomes the file ``dest``); returns the number of files written.

    boto3 finds the node's credentials and endpoint the usual way (environment, profile,
    instance role; ``AWS_ENDPOINT_URL_S3``)."""
    from skyward._optional import require

    errors = require("botocore.exceptions", "file_mounts from S3")
    BotoCoreError, ClientError = errors.BotoCoreError, errors.ClientError  # noqa: N806
    try:
        return _fetch(url, dest)
    except (BotoCoreError, ClientError) as exc:  # a clear line, not botocore's traceback
        code = exc.response["Error"].get("Code", "") if isinstance(exc, ClientError) else type(exc).__name__
        raise FileMountError("copy", url, dest, f"{code}: {exc}", tool="boto3") from None


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
