"""A type checker sees through @sky.compute: signatures are kept, result types survive."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
pytest.importorskip("mypy")


def mypy(path: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--ignore-missing-imports",
         "--follow-imports=silent", os.path.join(HERE, "typing", path)],
        capture_output=True, text=True, cwd=os.path.dirname(HERE),
    )


def test_result_types_survive_the_operators() -> None:
    done = mypy("operators_typed.py")
    assert done.returncode == 0, done.stdout + done.stderr


def test_wrong_argument_types_are_caught() -> None:
    done = mypy("operators_wrong.py")
    assert done.returncode == 1
    assert 'Argument 1 to "__call__" of "ComputeFunction" has incompatible type "str"' in done.stdout
    assert 'Unsupported operand types for >> ("PendingCompute[float]" and "int")' in done.stdout
