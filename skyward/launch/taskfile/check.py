"""Collecting every problem in a task file, so that one run reports them all.

A task file is checked field by field (:mod:`skyward.launch.taskfile.schema`,
:mod:`skyward.launch.taskfile.resources`); each check adds a :class:`Problem` (the file cannot run as
written) or a warning (a field is accepted but not honoured where the task runs) to one
:class:`Findings`, and keeps going. Only when every field has been seen does
:meth:`Findings.raise_problems` raise one :class:`TaskFileError` listing them all, one line each:
the field, what it accepts, and what it holds. A secret's value is never shown.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from skyward.errors import ConfigError

__all__ = ["Findings", "Problem", "TaskFileError", "shown"]


def shown(value: Any, limit: int = 100) -> str:
    """A value as a problem line shows it: its repr, cut to ``limit`` characters (a long string
    keeps its end: the part of a path that differs)."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return "'..." + text[-(limit - 4):] if isinstance(value, str) else text[:limit - 3] + "..."


@dataclass(frozen=True)
class Problem:
    """One reason a task file cannot run: ``field`` (``resources.any_of[1].accelerators``),
    what it accepts, and what it holds (already made safe to show)."""

    field: str
    accepted: str
    got: str
    detail: str = ""

    def line(self) -> str:
        text = f"{self.field}: expected {self.accepted}; got {self.got}"
        return text + (f" ({self.detail})" if self.detail else "")


class TaskFileError(ConfigError):
    """A task file that cannot run, with every reason (``problems``) at once.

    ``parameter``, ``accepted`` and ``got`` are the first problem's, so code that handles one
    :class:`~skyward.ConfigError` keeps working; the message lists them all.
    """

    def __init__(self, where: str, problems: tuple[Problem, ...] | list[Problem]):
        self.where = where
        self.problems = tuple(problems)
        first = self.problems[0]
        super().__init__(first.field, first.accepted, first.got, detail=first.detail)
        count = len(self.problems)
        head = f"{where}: {count} problem{'s' if count > 1 else ''} in the task file"
        self.args = ("\n".join([head, *("  " + p.line() for p in self.problems)]),)

    def __str__(self) -> str:
        return str(self.args[0])

    def __reduce__(self):  # type: ignore[override]
        return (TaskFileError, (self.where, self.problems))


@dataclass
class Findings:
    """Problems and warnings found so far in one task file (``where``: its path)."""

    where: str
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def problem(self, where: str, accepted: str, got: Any, detail: str = "", *, secret: bool = False) -> None:
        self.problems.append(Problem(where, accepted, "<hidden>" if secret else shown(got), detail))

    def unknown(self, prefix: str, key: Any, accepted: list[str] | tuple[str, ...]) -> None:
        """A key the block does not have (``prefix`` + key: ``resources.disk``), named with the
        keys it does have."""
        name = f"{prefix}{key}"
        public = sorted(k for k in accepted if not k.startswith("_"))
        self.problems.append(Problem(name, "a known key: one of " + ", ".join(public),
                                     f"unknown key {str(key)!r}", _nearest(str(key), accepted)))

    def warn(self, where: str, text: str) -> None:
        line = f"{where}: {text}"
        if line not in self.warnings:
            self.warnings.append(line)

    def raise_problems(self) -> None:
        if self.problems:
            raise TaskFileError(self.where, self.problems)


def _nearest(key: str, accepted: list[str] | tuple[str, ...]) -> str:
    import difflib

    close = difflib.get_close_matches(key, list(accepted), n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else ""
