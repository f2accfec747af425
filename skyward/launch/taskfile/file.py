"""Task files: reading SkyPilot's task YAML, one task or a pipeline of several.

:func:`read_tasks` parses a file with PyYAML (imported here, on use) and checks every
document with :func:`skyward.launch.taskfile.schema.check_task`, gathering every problem and warning in
one :class:`~skyward.launch.taskfile.check.Findings`; nothing is raised until the caller has added its
own (flags, variables, paths) and calls :meth:`~skyward.launch.taskfile.check.Findings.raise_problems`.

A file of several YAML documents is a pipeline: its tasks run one after another, each on its
own pool. A first document holding only ``name`` (SkyPilot's pipeline header) names the
pipeline; a header asking for parallel execution (a job group) is refused.

Imported only by ``skyward launch`` (PyYAML).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from skyward.launch.taskfile.check import Findings
from skyward.launch.taskfile.schema import TaskSpec, check_task
from skyward.errors import ConfigError, MissingDependency

__all__ = ["parse_minimum", "read_tasks"]

_HEADER_KEYS = frozenset({"name", "execution", "primary_tasks", "termination_delay"})


def parse_minimum(value: Any, parameter: str) -> tuple[int, bool] | None:
    """``"8"`` -> (8, False) exactly; ``"8+"`` -> (8, True) at least; an int -> exactly; None -> None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(parameter, 'an integer such as 8, or "8+" for at least 8', value)
    text = str(value).strip()
    match = re.fullmatch(r"([0-9]+)(\+?)", text)
    if not match or int(match.group(1)) < 1:
        raise ConfigError(parameter, 'an integer >= 1 such as 8, or "8+" for at least 8', value)
    return int(match.group(1)), bool(match.group(2))


def read_tasks(path: str | os.PathLike[str]) -> tuple[str | None, list[TaskSpec], Findings]:
    """The pipeline's name (or None), its tasks in order, and what was found wrong or ignored."""
    try:
        import yaml
    except ImportError as exc:  # an optional dependency: the worker and the library never need it
        raise MissingDependency("PyYAML", "skyward launch (reading task files)", "launch") from exc

    where = os.fspath(path)
    found = Findings(where)
    try:
        text = Path(where).read_text()
    except OSError as exc:
        found.problem("TASK", "a readable task file (YAML)", where, exc.strerror or str(exc))
        return None, [], found
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        found.problem("TASK", "a YAML task file (a mapping of keys such as run, setup and resources)", where,
                      _yaml_problem(exc, text))
        return None, [], found
    if not docs:
        found.problem("TASK", "a YAML mapping with at least a `run` key", where, "the file is empty")
        return None, [], found
    title = None
    if len(docs) > 1 and isinstance(docs[0], dict) and set(docs[0]) <= _HEADER_KEYS:
        header = docs.pop(0)
        title = str(header.get("name")) if header.get("name") is not None else None
        if "execution" in header and str(header["execution"]).lower() != "serial":
            found.problem("execution", "tasks run one after another (a pipeline)", header["execution"],
                          "a job group runs its tasks at the same time, each reaching the others by name "
                          "(TASK-0.GROUP), which skyward launch does not do; launch the tasks one by one")
    if len(docs) == 1 and not isinstance(docs[0], dict):
        found.problem("TASK", "a YAML mapping with at least a `run` key", where,
                      f"the file holds a {type(docs[0]).__name__}")
        return title, [], found
    tasks = []
    for number, doc in enumerate(docs, 1):
        task = check_task(doc, found, f"task {number}: " if len(docs) > 1 else "")
        if task is not None:
            tasks.append(task)
    return title, tasks, found


def _yaml_problem(exc: Exception, text: str) -> str:
    """Where the YAML breaks and what it looks like there, in words, not only the parser's."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if mark is None:
        return f"not valid YAML: {problem}"
    lines = text.splitlines()
    line = lines[mark.line] if 0 <= mark.line < len(lines) else ""
    hint = ""
    if "\t" in line:
        hint = "; YAML indents with spaces, and this line has a tab"
    elif "found character" in problem or "mapping values" in problem:
        hint = "; a value holding ': ' or starting with a special character needs quotes or a `|` block"
    elif "could not find expected ':'" in problem or "expected <block end>" in problem:
        hint = "; check this line's indentation against the lines above it"
    return f"not valid YAML at line {mark.line + 1}, column {mark.column + 1} ({line.strip()[:60]!r}): {problem}{hint}"
