"""One way to do each thing: one /proc reader, one worker-side log line, one class per name.

Each test reads skyward's source (what it checks is where code lives, not what it does; the
behaviour of each piece is tested through the public API elsewhere: tests/test_shell.py,
tests/contract/test_shell.py, tests/contract/test_elastic.py...)."""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "skyward"


def _sources() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in sorted(ROOT.rglob("*.py"))}


def test_only_procs_reads_proc_from_python() -> None:
    # Python reads of /proc/<pid>/stat, cmdline, environ... or a listing of /proc (shell text
    # run on a remote host, such as `grep ... /proc/[0-9]*/environ`, is another matter, and so
    # is a path handed to a shell: the reaper's /proc/<pid>/fd/N).
    reads = re.compile(r"""f["']/proc/\{[^}]*\}/(?!fd/)|listdir\(["']/proc["']\)""")
    assert [name for name, text in _sources().items() if reads.search(text)] == ["_procs.py"]


def test_the_command_guardian_imports_the_standard_library_only() -> None:
    # It runs as `python -I -S runtime/_reaper.py` and loads _procs.py by its path.
    for name in ("runtime/_reaper.py", "_procs.py"):
        tree = ast.parse((ROOT / name).read_text())
        imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names}
        imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom) and node.module != "__future__"}
        assert imported <= set(sys.stdlib_module_names), (name, imported - set(sys.stdlib_module_names))


def test_the_worker_side_writes_its_log_lines_in_one_place() -> None:
    # `[skyward.worker 123] ...`, `[skyward.resident 123] ...`: one helper makes them all.
    writers = [name for name, text in _sources().items() if name.startswith("worker/") and "[skyward." in text]
    assert writers == ["worker/log.py"]


#: Class names still defined in two places (each its own thing, to be renamed in turn).
KNOWN_TWICE = {"CommandResult", "LaunchPlan", "Link", "Pool"}


def test_no_two_classes_share_a_name() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for name, text in _sources().items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(name)
    twice = {cls: files for cls, files in where.items() if len(files) > 1 and cls not in KNOWN_TWICE}
    assert twice == {}
