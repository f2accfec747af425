"""Remote failures keep their type and traceback; lost workers and timeouts raise promptly."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

import skyward as sky
from tests.conftest import pid_alive


class CustomError(Exception):
    def __init__(self, code: int):
        super().__init__(f"custom failure {code}")
        self.code = code


class Unpicklable(Exception):
    def __init__(self) -> None:
        super().__init__("carries a lock")
        self.lock = threading.Lock()


@sky.compute
def fail_with(kind: str) -> None:
    if kind == "key":
        raise KeyError("missing")
    if kind == "custom":
        raise CustomError(7)
    if kind == "unpicklable":
        raise Unpicklable()


@sky.compute
def die(code: int) -> None:
    print("about to die", flush=True)
    time.sleep(0.2)  # let the line reach the client first
    os._exit(code)


@sky.compute
def node_of() -> int:
    return sky.instance_info().node


@sky.compute
def sleep_then_node(seconds: float) -> int:
    time.sleep(seconds)
    return sky.instance_info().node


@sky.compute(timeout=0.5)
def spins_too_long() -> str:
    for _ in range(200):  # short sleeps: the cancellation lands between them
        time.sleep(0.05)
    return "finished"


@sky.compute
def returns_lock() -> object:
    return threading.Lock()


@sky.compute
def add(a: object, b: object) -> object:
    return a + b  # type: ignore[operator]


def test_remote_exception_keeps_its_type_and_traceback(pool2: sky.ComputePool) -> None:
    with pytest.raises(KeyError) as info:
        fail_with("key") >> pool2
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "remote traceback" in notes
    assert "fail_with" in notes and 'raise KeyError("missing")' in notes


def test_user_exception_class_is_rebuilt_with_its_fields(pool2: sky.ComputePool) -> None:
    with pytest.raises(CustomError) as info:
        fail_with("custom") >> pool2
    assert info.value.code == 7
    assert "custom failure 7" in str(info.value)


def test_exception_that_cannot_be_rebuilt_becomes_remote_error(pool2: sky.ComputePool) -> None:
    with pytest.raises(sky.RemoteError) as info:
        fail_with("unpicklable") >> pool2
    err = info.value
    assert err.type_name.endswith("Unpicklable")
    assert err.message == "carries a lock"
    assert "fail_with" in err.traceback
    assert err.node in (0, 1)


def test_broadcast_failure_names_the_node(pool2: sky.ComputePool) -> None:
    with pytest.raises(KeyError) as info:
        fail_with("key") @ pool2
    assert getattr(info.value, "node", None) in (0, 1)


def test_unpicklable_argument_is_named_before_anything_is_sent(pool2: sky.ComputePool) -> None:
    with pytest.raises(sky.SerializationError) as info:
        add(threading.Lock(), 1) >> pool2
    assert "argument 'a'" in str(info.value)
    assert info.value.parameter == "argument 'a' of add()"
    assert isinstance(info.value, TypeError)
    assert add(1, 2) >> pool2 == 3  # nothing half-sent broke the pool


def test_unpicklable_return_value_raises_serialization_error(pool2: sky.ComputePool) -> None:
    with pytest.raises(sky.SerializationError, match="return value"):
        returns_lock() >> pool2


def test_task_timeout_raises_and_frees_the_slot() -> None:
    with sky.ComputePool(nodes=1, console=False) as pool:
        started = time.monotonic()
        with pytest.raises(sky.TaskTimeout) as info:
            spins_too_long() >> pool
        assert time.monotonic() - started < 3
        assert info.value.timeout == 0.5 and info.value.task == "spins_too_long"
        # The one slot is usable again: the timed-out task was interrupted on the worker.
        started = time.monotonic()
        assert node_of() >> pool == 0
        assert time.monotonic() - started < 3


def test_worker_dying_mid_task_raises_worker_lost_and_other_nodes_keep_working() -> None:
    with sky.ComputePool(nodes=2, console=False) as pool:
        long_task = sleep_then_node(1.5) > pool  # lands on one node
        started = time.monotonic()
        with pytest.raises(sky.WorkerLost) as info:
            die(7) >> pool  # least busy: the other node
        assert time.monotonic() - started < 5
        lost = info.value
        assert lost.exit_code == 7
        assert lost.node == 1 - long_task.result(timeout=10)
        assert any("about to die" in line for line in lost.log_tail)
        # The surviving node goes on serving.
        assert [node_of() >> pool for _ in range(3)] == [1 - lost.node] * 3
        # Broadcasting to a pool with a lost node says so instead of hanging.
        with pytest.raises(sky.WorkerLost):
            node_of() @ pool


def test_worker_killed_from_outside_raises_worker_lost_promptly() -> None:
    with sky.ComputePool(nodes=1, console=False) as pool:
        future = sleep_then_node(30) > pool
        time.sleep(0.3)
        pid = pool.worker_pids()[0]
        assert pid is not None and pid_alive(pid)
        started = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(sky.WorkerLost) as info:
            future.result(timeout=10)
        assert time.monotonic() - started < 5
        assert info.value.exit_code == -signal.SIGKILL
        assert info.value.node == 0


@sky.compute
def head_blocks_other_fails() -> int:
    if sky.instance_info().node == 1:
        raise ValueError("rank 1 broke")
    time.sleep(120)  # one C call: an interruption can't land until it returns, like a collective
    return 0


def test_failed_broadcast_with_a_blocked_node_raises_promptly_and_restarts_workers() -> None:
    with sky.ComputePool(nodes=2, console=False) as pool:
        old = pool.worker_pids()
        started = time.monotonic()
        with pytest.raises(ValueError, match="rank 1 broke") as info:
            head_blocks_other_fails() @ pool
        assert time.monotonic() - started < 10
        assert info.value.node == 1  # type: ignore[attr-defined]
        notes = "\n".join(info.value.__notes__)
        assert "node(s) [0] did not stop" in notes and "restarted" in notes
        # The pool is usable with fresh workers, and the old ones are gone.
        assert node_of() @ pool == [0, 1]
        assert set(pool.worker_pids()).isdisjoint(old)
        assert not any(pid_alive(p) for p in old if p)


@sky.compute(timeout=0.3)
def imports_slowly_then_spins() -> None:
    import tests.data.slow_import  # noqa: F401

    for _ in range(100):
        time.sleep(0.05)


@sky.compute
def slow_import_ready() -> bool:
    import tests.data.slow_import

    return tests.data.slow_import.READY


def test_timeout_never_interrupts_an_import(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    marker = tmp_path / "marker"
    monkeypatch.setenv("SLOW_IMPORT_MARKER", str(marker))
    with sky.ComputePool(nodes=1, console=False) as pool:
        with pytest.raises(sky.TaskTimeout):
            imports_slowly_then_spins() >> pool
        assert slow_import_ready() >> pool is True
    assert not marker.exists(), marker.read_text()


@sky.compute
def spin_then_mark(path: str, seconds: float) -> None:
    for _ in range(int(seconds / 0.05)):
        time.sleep(0.05)
    with open(path, "a") as f:
        f.write("ran\n")


def test_a_queued_task_that_times_out_never_starts(tmp_path) -> None:  # type: ignore[no-untyped-def]
    first, second = tmp_path / "first", tmp_path / "second"
    with sky.ComputePool(nodes=1, console=False) as pool:
        running = spin_then_mark(str(first), 1.0) > pool
        late = sky.compute(timeout=0.3)(spin_then_mark.fn)
        with pytest.raises(sky.TaskTimeout):
            late(str(second), 0.0) >> pool  # waits in the queue behind the first task
        running.result(timeout=10)
        assert node_of() >> pool == 0  # the slot is free again and the queue is empty
    assert first.exists() and not second.exists()


def test_bootstrap_error_shows_step_markers_as_words() -> None:
    from skyward.errors import BootstrapError

    err = BootstrapError("gpu1", "pip", "failed", log_tail=["::step:: pip", "ERROR: no such package", "::warm::"])
    assert "::" not in str(err)
    assert "    step pip\n    ERROR: no such package\n    environment reused" in str(err)
    assert err.log_tail[0] == "::step:: pip"  # the field keeps what the host printed


def _stand_in(tools, name: str, script: str) -> None:
    (tools / name).write_text("#!/bin/sh\n" + script)
    (tools / name).chmod(0o755)


def test_a_bucket_copy_that_fails_on_a_node_raises_file_mount_error_with_its_fields(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """On a real node (a Local worker) the store's tool (a stand-in gcloud that is refused)
    fails: the client gets the typed error, its fields and the tool's last line."""
    from skyward.errors import FileMountError
    from skyward.launch.taskfile.stores import Bucket, fetch_store

    tools = tmp_path / "bin"
    tools.mkdir()
    _stand_in(tools, "gcloud", "echo 'AccessDeniedException: 403 no access' >&2\nexit 1\n")
    monkeypatch.setenv("PATH", str(tools))  # (the first of the store's tools: the one used)
    dest = str(tmp_path / "data")
    with sky.ComputePool(nodes=1, console=False) as pool, pytest.raises(FileMountError) as info:
        sky.compute(fetch_store)(Bucket("gs", "b", "p"), dest) >> pool
    error = info.value
    assert (error.action, error.url, error.dest, error.tool) == ("copy", "gs://b/p", dest, "gcloud")
    assert "AccessDeniedException: 403 no access" in error.reason
    assert str(error).startswith(f"file_mounts: could not copy gs://b/p to {dest} with gcloud: exit status 1")


def test_a_node_with_no_tool_for_a_store_raises_file_mount_error_naming_the_tools(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import pickle

    from skyward.errors import FileMountError
    from skyward.launch.taskfile.stores import Bucket, fetch_store

    monkeypatch.setenv("PATH", str(tmp_path))  # none of gcloud, gsutil, rclone
    with pytest.raises(FileMountError) as info:
        fetch_store(Bucket("gs", "b", "p"), "/d")
    error = info.value
    assert (error.action, error.tool, error.tools) == ("copy", None, ("gcloud", "gsutil", "rclone"))
    assert str(error) == "file_mounts: could not copy gs://b/p to /d: it needs gcloud or gsutil or rclone on the " \
                         "node, and the node has none"
    again = pickle.loads(pickle.dumps(error))  # (it travels from the node)
    assert type(again) is FileMountError and str(again) == str(error) and again.tools == error.tools


def test_task_files_without_pyyaml_raise_missing_dependency_naming_the_extra(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import sys

    from skyward.errors import MissingDependency
    from skyward.launch import plan

    (tmp_path / "task.yaml").write_text("run: echo\n")
    monkeypatch.setitem(sys.modules, "yaml", None)  # as if PyYAML were not installed
    with pytest.raises(MissingDependency) as info:
        plan(tmp_path / "task.yaml")
    assert (info.value.package, info.value.extra) == ("PyYAML", "launch")
    assert "pip install 'skyward[launch]'" in str(info.value)


def test_a_detached_run_without_a_cluster_is_a_config_error_before_anything_starts(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from skyward.launch import execute, plan
    from skyward.runtime.cluster import CLUSTER_DIR, jobs_dir

    (tmp_path / "task.yaml").write_text("run: echo\n")
    with pytest.raises(sky.ConfigError) as info:
        execute(plan(tmp_path / "task.yaml"), console=False, detach_run=True)
    assert info.value.parameter == "detach_run" and "named cluster" in info.value.accepted
    monkeypatch.delenv(CLUSTER_DIR, raising=False)
    with pytest.raises(sky.ConfigError) as info:  # on a node: not a cluster's worker
        jobs_dir(0)
    assert info.value.parameter == "detach_run" and "named cluster" in info.value.accepted
