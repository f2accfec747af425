"""Buckets in every store a task file names: how the plan says each reaches the nodes, a Local
launch refused before it starts where this machine lacks the store's tool, the tool a node
picks, and the commands that copy or mount a bucket."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

import skyward as sky
from skyward.launch.taskfile.stores import Bucket, copy_commands, find_tool, mount_command, parse, unmount
from skyward.launch import plan

SSH = {"provider": "ssh", "hosts": ["me@192.0.2.1"]}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "task.yaml"
    path.write_text(textwrap.dedent(text))
    return path


STORES = [
    ("gs://b/data", "gs://b/data", "copied with gcloud, gsutil or rclone on every node"),
    ("{name: b, store: gcs, mode: COPY}", "gs://b", "copied with gcloud, gsutil or rclone on every node"),
    ("{source: 'gs://b', mode: MOUNT}", "gs://b",
     "mounted with gcsfuse or rclone, whichever the node has; copied with gcloud, gsutil or rclone where it has none"),
    ("r2://b/x", "r2://b/x", "copied with aws on every node"),
    ("{name: b, store: nebius, mode: MOUNT}", "nebius://b",
     "copied with aws on every node (Nebius Object Storage is not mounted)"),
    ("cw://b", "cw://b", "copied with aws on every node"),
    ("cos://us-east/b/x", "cos://us-east/b/x", "copied with aws on every node"),
    ("oci://b@us-sanjose-1/x", "oci://b@us-sanjose-1/x", "copied with oci on every node"),
    ("{name: b, store: oci, mode: COPY}", "oci://b", "copied with oci on every node"),
    ("https://acct.blob.core.windows.net/c/x/", "https://acct.blob.core.windows.net/c/x", "copied with az on every node"),
]


@pytest.mark.parametrize(("source", "url", "how"), STORES, ids=[s[1] for s in STORES])
def test_a_bucket_in_any_store_is_planned_with_the_tools_that_fetch_it(tmp_path: Path, source: str, url: str,
                                                                       how: str) -> None:
    p = plan(write(tmp_path, f"file_mounts: {{/d: {source}}}\nrun: echo\n"), **SSH)
    print(p.describe())
    assert f"bucket: {url} -> /d ({how})" in p.describe()


def test_on_local_a_store_whose_tool_this_machine_lacks_is_refused_before_anything_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tools = tmp_path / "bin"
    tools.mkdir()
    monkeypatch.setenv("PATH", str(tools))
    task = write(tmp_path, "file_mounts: {/d: 'gs://b/x', /e: 'oci://b/y', /f: 's3://b/z'}\nrun: echo\n")
    with pytest.raises(sky.ConfigError) as info:
        plan(task)
    said = [p.line() for p in info.value.problems]
    print(said)
    assert said == [
        "file_mounts['/d']: expected gs:// buckets where gcloud or gsutil or rclone is installed (the Local nodes "
        "are this machine); got 'gs://b/x' (gcloud or gsutil or rclone is not on this machine's PATH)",
        "file_mounts['/e']: expected oci:// buckets where oci is installed (the Local nodes are this machine); "
        "got 'oci://b/y' (oci is not on this machine's PATH)"]
    (tools / "rclone").symlink_to(shutil.which("true", path="/bin:/usr/bin") or "/bin/true")
    with pytest.raises(sky.ConfigError) as info:
        plan(task)
    assert [p.field for p in info.value.problems] == ["file_mounts['/e']"]
    assert plan(task, **SSH).buckets  # the nodes are elsewhere: they look for the tool themselves


def test_a_node_finds_a_tool_on_its_path_or_in_the_workers_own_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setenv("PATH", str(tmp_path))
    (tmp_path / "gsutil").symlink_to("/bin/true")
    assert find_tool("gsutil") == str(tmp_path / "gsutil")
    assert find_tool(Path(sys.executable).name) == sys.executable  # where pip puts a remote node's tools
    assert find_tool("no-such-tool-here") is None


PARSED = [
    ("s3://b", Bucket("s3", "b")),
    ("gs://b/a/b.txt", Bucket("gs", "b", "a/b.txt")),
    ("cos://eu-de/b/p", Bucket("cos", "b", "p", region="eu-de")),
    ("oci://b@us-sanjose-1", Bucket("oci", "b", region="us-sanjose-1")),
    ("https://acct.blob.core.windows.net/c", Bucket("az", "c", account="acct")),
    ("https://acct.blob.core.windows.net/c/a/b", Bucket("az", "c", "a/b", account="acct")),
]


@pytest.mark.parametrize(("url", "bucket"), PARSED, ids=[p[0] for p in PARSED])
def test_a_bucket_url_is_read_into_its_store_bucket_and_prefix_and_written_back_alike(url: str, bucket: Bucket) -> None:
    assert parse(url) == bucket and bucket.url == url


@pytest.mark.parametrize("url", ["ftp://h/x", "cos://only-region", "az://c", "gs://"])
def test_a_url_no_store_has_is_refused_saying_what_is_accepted(url: str) -> None:
    with pytest.raises(sky.ConfigError, match="invalid file_mounts source: expected .*(s3://|cos://REGION/BUCKET)"):
        parse(url)


COPIES = [
    (Bucket("gs", "b", "p"), "gsutil", ["gsutil", "-q", "stat", "gs://b/p"], ["gsutil", "-m", "-q", "rsync", "-r",
                                                                            "gs://b/p", "/d"]),
    (Bucket("gs", "b", "p"), "rclone", None, ["rclone", "copyto", ":gcs,env_auth=true:b/p", "/d"]),
    (Bucket("nebius", "b", "p"), "aws", ["aws", "s3api", "head-object", "--bucket", "b", "--key", "p", "--profile",
                                         "nebius"], ["aws", "s3", "sync", "--only-show-errors", "s3://b/p", "/d",
                                                     "--profile", "nebius"]),
    (Bucket("cos", "b", "", region="eu-de"), "aws", ["aws", "s3api", "head-object", "--bucket", "b", "--key", "",
                                                     "--endpoint-url",
                                                     "https://s3.eu-de.cloud-object-storage.appdomain.cloud"],
     ["aws", "s3", "sync", "--only-show-errors", "s3://b", "/d", "--endpoint-url",
      "https://s3.eu-de.cloud-object-storage.appdomain.cloud"]),
]


@pytest.mark.parametrize(("bucket", "tool", "check", "many"), COPIES, ids=[f"{c[0].url}-{c[1]}" for c in COPIES])
def test_the_copy_commands_name_the_store_the_way_each_tool_does(bucket: Bucket, tool: str, check: list[str] | None,
                                                                 many: list[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    got_check, _, got_many = copy_commands(bucket, tool, "/d")
    assert (got_check, got_many) == (check, many)


MOUNTS = [
    ("mount-s3", Bucket("s3", "b", "p"), None, ["mount-s3", "b", "/m", "--prefix", "p/"]),
    ("goofys", Bucket("s3", "b"), "http://127.0.0.1:9", ["goofys", "--endpoint", "http://127.0.0.1:9", "b", "/m"]),
    ("s3fs", Bucket("s3", "b", "p"), None, ["s3fs", "b:/p", "/m"]),
    ("rclone", Bucket("s3", "b", "p"), None, ["rclone", "mount", "--daemon", ":s3,provider=AWS,env_auth=true:b/p",
                                              "/m"]),
    ("gcsfuse", Bucket("gs", "b", "p"), None, ["gcsfuse", "--only-dir", "p", "b", "/m"]),
]


@pytest.mark.parametrize(("tool", "bucket", "endpoint", "command"), MOUNTS, ids=[m[0] for m in MOUNTS])
def test_each_mount_tool_mounts_the_bucket_and_prefix_asked_for(tool: str, bucket: Bucket, endpoint: str | None,
                                                               command: list[str]) -> None:
    assert mount_command(bucket, tool, "/m", endpoint) == command


def test_unmounting_where_nothing_is_mounted_says_so_and_changes_nothing(tmp_path: Path) -> None:
    assert unmount(str(tmp_path)) is False and tmp_path.is_dir()


def _can_mount(tmp_path: Path) -> bool:
    import subprocess

    probe = tmp_path / "probe"
    probe.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "probe", str(probe)], capture_output=True, check=False).returncode:
        return False
    subprocess.run(["umount", str(probe)], check=True)
    return True


@pytest.mark.may_skip("mounting needs root (CAP_SYS_ADMIN) where the suite runs")
@pytest.mark.parametrize("run", ["cat $MOUNTED/args && mountpoint -q $MOUNTED", "exit 3"], ids=["ok", "failing"])
def test_a_mounted_bucket_is_mounted_before_setup_and_unmounted_when_the_task_ends(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run: str) -> None:
    """The mount tool here is a stand-in for goofys that mounts a tmpfs: the node's choice of
    tool, its arguments, the task seeing the mount and the unmount on every exit are real; S3 is not."""
    from io import StringIO

    from skyward.launch import execute

    if not _can_mount(tmp_path):
        pytest.skip("this machine does not let the tests mount")
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "goofys").write_text('#!/bin/sh\nfor last; do :; done\n'
                                  'mount -t tmpfs goofys-stand-in "$last" && echo "$@" > "$last/args"\n')
    (tools / "goofys").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:/usr/bin:/bin:/usr/sbin:/sbin")
    assert find_tool("mount-s3") is None and find_tool("goofys") == str(tools / "goofys")
    mounted = tmp_path / "data"
    task = write(tmp_path, f"""
        envs: {{MOUNTED: {mounted}}}
        file_mounts: {{{mounted}: {{source: 's3://my-bucket/train', mode: MOUNT}}}}
        setup: mountpoint -q $MOUNTED
        run: {run}
    """)
    lines: list[str] = []
    err = StringIO()
    try:
        code = execute(plan(task), console=False, err=err,
                       on_event=lambda e: lines.append(e.line) if hasattr(e, "line") else None)
        assert code == (0 if run != "exit 3" else 3), err.getvalue()
        if code == 0:
            assert lines == [f"my-bucket:train {mounted}"]
        assert not mounted.is_mount() and mounted.is_dir() and not list(mounted.iterdir())
        assert "not mounted" not in err.getvalue()
    finally:  # (a failing test leaves no mount behind either)
        if mounted.is_mount():
            import subprocess

            subprocess.run(["umount", str(mounted)], check=False)


@pytest.mark.may_skip("mounting needs root (CAP_SYS_ADMIN) where the suite runs")
def test_a_bucket_is_not_mounted_over_a_mount_point_and_what_was_mounted_there_stays(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess
    from io import StringIO

    from skyward.launch import execute

    if not _can_mount(tmp_path):
        pytest.skip("this machine does not let the tests mount")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "theirs", str(theirs)], check=True)
    try:
        task = write(tmp_path, f"file_mounts: {{{theirs}: {{source: 's3://b', mode: MOUNT}}}}\nrun: echo\n")
        err = StringIO()
        assert execute(plan(task), console=False, err=err) == 1
        assert f"{theirs} is a mount point already; mounting s3://b there would hide it" in err.getvalue()
        assert theirs.is_mount() and unmount(str(theirs)) is False and theirs.is_mount()
    finally:
        subprocess.run(["umount", str(theirs)], check=False)
