"""Task output streams back live, line by line, prefixed by node; silencing is per task."""

from __future__ import annotations

import sys
import time

import pytest

import skyward as sky
from skyward import events as ev


@sky.compute
def chatty(tag: str, lines: int, pause: float) -> str:
    for i in range(lines):
        print(f"{tag} {i}")
        time.sleep(pause)
    print(f"{tag} to stderr", file=sys.stderr)
    return tag


@sky.compute
@sky.silent
def quiet(lines: int, pause: float) -> str:
    for i in range(lines):
        print(f"SECRET {i}")
        print(f"SECRET err {i}", file=sys.stderr)
        time.sleep(pause)
    return "quiet"


@sky.compute
@sky.stdout(only="head")
def head_only() -> int:
    print(f"hello from {sky.instance_info().node}")
    print(f"stderr from {sky.instance_info().node}", file=sys.stderr)
    return sky.instance_info().node


@sky.compute
@sky.stdout(only=lambda info: info.node == 1)
def second_only() -> None:
    print(f"predicate {sky.instance_info().node}")


def collect(pool: sky.ComputePool) -> list[tuple[float, ev.TaskOutput]]:
    seen: list[tuple[float, ev.TaskOutput]] = []
    pool.subscribe(lambda e: seen.append((time.monotonic(), e)) if isinstance(e, ev.TaskOutput) else None)
    return seen


def test_output_is_printed_with_node_prefix(capsys: pytest.CaptureFixture[str]) -> None:
    with sky.ComputePool(nodes=2) as pool:
        chatty("hi", 2, 0.0) @ pool
    out, err = capsys.readouterr()
    for node in (0, 1):
        assert f"[node {node}] hi 0\n" in out and f"[node {node}] hi 1\n" in out
        assert f"[node {node}] hi to stderr\n" in err


def test_output_streams_while_the_task_runs() -> None:
    with sky.ComputePool(nodes=1, console=False) as pool:
        seen = collect(pool)
        assert chatty("live", 3, 0.4) >> pool == "live"
        done = time.monotonic()
    first = next(t for t, e in seen if e.line == "live 0")
    assert done - first > 0.7  # the first line arrived long before the task ended
    assert [e.line for _, e in seen if e.stream == "stdout"] == ["live 0", "live 1", "live 2"]


def test_silencing_applies_to_one_task_only_with_concurrency_2() -> None:
    with sky.ComputePool(nodes=1, concurrency=2, console=False) as pool:
        seen = collect(pool)
        result = (quiet(5, 0.1) & chatty("loud", 5, 0.1)) >> pool
    assert result == ("quiet", "loud")
    lines = [e.line for _, e in seen]
    assert not any("SECRET" in line for line in lines)
    assert [f"loud {i}" for i in range(5)] == [ln for ln in lines if ln.startswith("loud ") and "stderr" not in ln]


def test_stdout_only_head_silences_other_nodes_stdout_but_not_stderr() -> None:
    with sky.ComputePool(nodes=2, console=False) as pool:
        seen = collect(pool)
        assert head_only() @ pool == [0, 1]
        second_only() @ pool
    stdout = [(e.node, e.line) for _, e in seen if e.stream == "stdout"]
    stderr = sorted((e.node, e.line) for _, e in seen if e.stream == "stderr")
    assert (0, "hello from 0") in stdout and (1, "hello from 1") not in stdout
    assert stderr == [(0, "stderr from 0"), (1, "stderr from 1")]
    assert [line for node, line in stdout if line.startswith("predicate")] == ["predicate 1"]


def test_output_control_works_outside_a_pool(capsys: pytest.CaptureFixture[str]) -> None:
    assert head_only.local() == 0  # node 0 of 1 is the head: prints
    quiet.local(1, 0.0)
    out, err = capsys.readouterr()
    assert "hello from 0" in out
    assert "SECRET" not in out and "SECRET" not in err
