"""What people already do gets the behaviour they expect, or an answer that points at the fix:
a pool across notebook cells, a forgotten ``@sky.compute``, decorators in the other order, an open
file as an argument, ``breakpoint()`` in a task, a pending computation used as a value."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap

import pytest

import skyward as sky
from tests.conftest import pid_alive, wait_gone


@sky.compute
def node_of(x: int) -> tuple[int, int]:
    return sky.instance_info().node, x


def plain_function(x: int) -> int:
    return x + 1


# -- notebooks: open() ... close() -------------------------------------------------------------------
def test_open_and_close_run_a_pool_without_a_with_block() -> None:
    pool = sky.ComputePool(nodes=2).open()
    try:
        assert pool.is_open
        assert node_of(5) @ pool == [(0, 5), (1, 5)]
        pids = [p for p in pool.worker_pids() if p is not None]
        assert len(pids) == 2 and all(pid_alive(p) for p in pids)
    finally:
        pool.close()
    assert not pool.is_open
    assert wait_gone(pids, 10) == []
    pool.close()  # closing twice does nothing


def test_a_pool_left_open_is_closed_when_the_interpreter_exits(tmp_path) -> None:
    script = tmp_path / "notebook.py"
    script.write_text(textwrap.dedent("""
        import skyward as sky
        from skyward import events

        def on_event(event):
            if isinstance(event, events.PoolStopped):
                print("stopped clean" if event.clean else "stopped unclean", flush=True)

        pool = sky.ComputePool(nodes=2, console=False, on_event=on_event).open()
        print(*pool.worker_pids(), flush=True)
        # the kernel is restarted: no pool.close()
    """))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this checkout's skyward
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": root})
    assert done.returncode == 0, done.stderr
    first, last = done.stdout.splitlines()
    pids = [int(p) for p in first.split()]
    assert len(pids) == 2
    assert last == "stopped clean"  # the pool's own teardown ran at exit, not only the workers' switch
    assert wait_gone(pids, 10) == []


# -- a forgotten @sky.compute ------------------------------------------------------------------------
def test_a_plain_function_with_an_operator_asks_about_sky_compute(pool2: sky.ComputePool) -> None:
    with pytest.raises(sky.ConfigError, match=r"did you forget @sky\.compute on plain_function\?"):
        plain_function @ pool2  # type: ignore[operator]
    with pytest.raises(sky.ConfigError, match=r"did you forget @sky\.compute\? Without it the function ran here"):
        plain_function(1) >> pool2  # type: ignore[operator]
    with pytest.raises(sky.ConfigError, match=r"left-hand side of >"):
        plain_function(1) > pool2  # type: ignore[operator]


# -- @sky.stdout above @sky.compute ---------------------------------------------------------------
@sky.stdout(only="head")
@sky.compute
def talk_upside_down() -> int:
    node = sky.instance_info().node
    print(f"talking on {node}")
    return node


def test_stdout_above_compute_is_applied_to_the_task(capsys: pytest.CaptureFixture[str]) -> None:
    assert isinstance(talk_upside_down, sky.ComputeFunction)
    with sky.ComputePool(nodes=2) as pool:  # a console: task output is printed
        assert talk_upside_down() @ pool == [0, 1]
    out = capsys.readouterr().out
    assert "[node 0] talking on 0" in out and "talking on 1" not in out


# -- an open file ------------------------------------------------------------------------------------
@sky.compute
def first_line(source) -> str:  # noqa: ANN001
    return source.readline()


def test_an_open_file_argument_is_a_serialization_error(pool2: sky.ComputePool, tmp_path) -> None:
    path = tmp_path / "data.txt"
    path.write_text("hello\n")
    with open(path) as f, pytest.raises(sky.SerializationError, match=r"argument 'source' of first_line\(\).*pass its path"):
        first_line(f) >> pool2
    with pytest.raises(sky.SerializationError):
        first_line(source=io.BytesIO(b"x")) >> pool2


# -- breakpoint() in a task --------------------------------------------------------------------------
@sky.compute
def debug_me() -> int:
    breakpoint()
    return 1


def test_breakpoint_in_a_task_explains_that_there_is_no_terminal(pool2: sky.ComputePool) -> None:
    with pytest.raises(RuntimeError, match=r"breakpoint\(\) in a task on node \d: .*no terminal.*f\.local"):
        debug_me() >> pool2
    assert node_of(1) >> pool2 in ((0, 1), (1, 1))  # the pool is fine afterwards


# -- a pending computation used as a value -------------------------------------------------------
@pytest.mark.parametrize("use", [
    lambda p: p + 1, lambda p: 1 + p, lambda p: p * 2, lambda p: bool(p), lambda p: float(p),
    lambda p: list(p), lambda p: p[0], lambda p: p < 3,
])
def test_a_pending_computation_used_as_a_value_says_it_has_not_run(use) -> None:  # noqa: ANN001
    with pytest.raises(TypeError, match=r"<PendingCompute node_of\(\.\.\.\)> has not been computed yet: run it first"):
        use(node_of(1))
