"""``sky.shell``: a shell command as a pending computation.

``sky.shell("nvidia-smi")`` runs nothing; like a call of a ``@sky.compute`` function it returns
a :class:`~skyward.PendingCompute`, and the operators decide where the command runs:

>>> import skyward as sky
>>> with sky.ComputePool(nodes=2) as pool:                     # doctest: +SKIP
...     sky.shell("hostname") @ pool                           # every node: [CommandResult, ...]
...     sky.shell("echo hi") >> pool                           # one node
...     (sky.shell("make data") & prepare()) >> pool           # with Python tasks

The task's function is :func:`skyward.runtime.command.run_command` and its argument a
:class:`ShellCommand` value, so a command travels, is dispatched, cancelled, timed out and
reported exactly like any task: one code path. On the node, the command runs under a small
guardian process that owns its whole process tree (see :mod:`skyward.runtime.command`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from skyward.compute import PendingCompute, TaskOptions
from skyward.errors import ConfigError
from skyward.runtime.command import CommandResult, Only, ShellCommand, run_command

__all__ = ["CommandResult", "ShellCommand", "shell"]


def shell(
    command: str,
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    check: bool = True,
    timeout: float | None = None,
    only: Only = "all",
) -> PendingCompute[CommandResult]:
    """A shell command to run on a pool, as a :class:`~skyward.PendingCompute`.

    The command runs with ``bash -c`` (``sh`` where bash is missing) in the node's environment
    (``SKYWARD_NODE_RANK``, ``SKYWARD_NODE_IPS``... and their ``SKYPILOT_*`` aliases, see
    :doc:`commands`) plus ``env``, in ``cwd`` (a directory on the node; default: the worker's
    working directory). Its output streams to the console line by line, prefixed by node;
    ``only`` chooses which nodes stream it (``"all"``, ``"head"``, a predicate taking an
    :class:`~skyward.InstanceInfo`, or ``None``); every node keeps the last lines for its
    result either way.

    Returns (once sent to a pool) a :class:`CommandResult` per node that ran it. With
    ``check=True`` a non-zero exit raises :class:`~skyward.CommandFailed` (node, command,
    exit code or signal, last lines); on a broadcast the other nodes' commands are stopped.
    ``timeout`` (seconds) raises :class:`~skyward.TaskTimeout` and stops the command. A stopped
    command (timeout, a cancelled future, Ctrl-C, the pool closing) has its whole process tree
    killed, including processes that left its session.

    Raises :class:`~skyward.ConfigError` for bad input, before anything runs.
    """
    if not isinstance(command, str) or not command.strip():
        raise ConfigError("command", "a non-empty string of shell code", command)
    pairs: list[tuple[str, str]] = []
    if env is not None:
        if not isinstance(env, Mapping):
            raise ConfigError("env", "a mapping of variable names to strings, or None", env)
        for key, value in env.items():
            if not isinstance(key, str) or not key or "=" in key or "\0" in key:
                raise ConfigError("env", "variable names: non-empty strings without '=' or NUL", key)
            if not isinstance(value, str) or "\0" in value:
                raise ConfigError(f"env[{key!r}]", "a string without NUL characters",
                                  "<hidden>" if _looks_secret(key) else value)
            pairs.append((key, value))
    where: str | None = None
    if cwd is not None:
        if not isinstance(cwd, (str, os.PathLike)) or not os.fspath(cwd):
            raise ConfigError("cwd", "a directory path on the node (a string), or None", cwd)
        where = os.fspath(cwd)
    if not isinstance(check, bool):
        raise ConfigError("check", "True or False", check)
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not timeout > 0 or timeout == float("inf")):
        raise ConfigError("timeout", "a positive number of seconds or None", timeout)
    if not (only is None or only in ("all", "head") or callable(only)):
        raise ConfigError("only", '"all", "head", a predicate taking an InstanceInfo, or None', only)
    spec = ShellCommand(command, tuple(pairs), where, check, only)
    name = "shell: " + _short(command)
    return PendingCompute(run_command, (spec,), {},
                          TaskOptions(name, float(timeout) if timeout else None, per_node=True))


def _short(command: str, limit: int = 40) -> str:
    first = command.strip().splitlines()[0]
    return first if len(first) <= limit and "\n" not in command.strip() else first[:limit] + " ..."


def _looks_secret(name: str) -> bool:
    from skyward.image import _looks_secret as looks

    return looks(name)
