"""Task files: the SkyPilot task YAML subset that ``skyward launch`` reads, as one typed model.

A task file says what to run on every node of a pool (``setup`` then ``run``, shell code),
with what environment (``envs``, ``secrets``), files (``workdir``, ``file_mounts``) and
machines (``num_nodes``, ``resources``). Accepted keys:

==============  =================================================================================
``name``        a label for the run (shown in the plan)
``num_nodes``   nodes in the pool (an integer >= 1; default 1)
``resources``   ``accelerators`` ("L4:2" or ``{L4: 2}``), ``cpus`` / ``memory`` ("8", "8+": at
                least), ``use_spot``, ``region``, ``instance_type``
``envs``        variables for setup and run; a null value must be given with ``--env K=V``
``secrets``     like ``envs``, but never shown in output, plans or errors
``workdir``     a local directory synced to every node; setup and run start in it
``file_mounts`` ``{path on the node: local path}``, copied to every node before setup
``setup``       shell code run on every node before ``run``
``run``         shell code run on every node (required)
==============  =================================================================================

:func:`load_task` parses with PyYAML (imported here, on use) and validates with
:class:`TaskFile`; any problem is a :class:`~skyward.errors.ConfigError` naming the key, what
it accepts and the value (a secret's value is never shown), before anything is provisioned.
Imported only by ``skyward launch`` (pydantic, PyYAML).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, Field

from skyward._config import STRICT, Count, Flag, reject, validate
from skyward.accelerators import parse_accelerator
from skyward.errors import ConfigError, SkywardError

__all__ = ["Resources", "TaskFile", "load_task", "parse_minimum"]

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _env_name(name: str) -> str:
    if not _ENV_NAME.fullmatch(name):
        reject("a variable name (letters, digits and _, not starting with a digit)", name)
    return name


def _env_value(value: Any) -> Any:
    # YAML reads `EPOCHS: 10` as an int and `DEBUG: true` as a bool: the shell sees text.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return value


def _secret_value(value: Any) -> Any:
    value = _env_value(value)
    if value is not None and not isinstance(value, str):
        reject("a string, a number, or null (then pass it with --secret NAME)", "<hidden>")
    return value


EnvName = Annotated[str, AfterValidator(_env_name)]
EnvValue = Annotated[str | None, BeforeValidator(_env_value),
                     Field(description="a string, a number, or null (then pass it with --env NAME=VALUE)")]
SecretValue = Annotated[str | None, BeforeValidator(_secret_value),
                        Field(description="a string, a number, or null (then pass it with --secret NAME)")]


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


def _accelerators(value: Any) -> Any:
    if isinstance(value, Mapping):
        if len(value) != 1:
            reject('one accelerator, such as "L4:2" or {L4: 2}', dict(value),
                   detail="lists of candidate accelerators are not supported")
        (name, count), = value.items()
        value = f"{name}:{count}" if count is not None else str(name)
    if not isinstance(value, str):
        reject('one accelerator, such as "L4:2" or {L4: 2}', value)
    try:
        parse_accelerator(value)
    except ConfigError as exc:  # reported under this key, not parse_accelerator's own name
        reject(exc.accepted, value, detail=exc.detail)
    return value


def _minimum(parameter: str) -> Any:
    def check(value: Any) -> Any:
        if value is None:
            return None
        parse_minimum(value, f"resources.{parameter}")
        return str(value).strip()

    return Annotated[str | None, BeforeValidator(check),
                     Field(description='an integer such as 8, or "8+" for at least 8')]


class Resources(BaseModel):
    """The ``resources:`` block: what each node needs."""

    model_config = STRICT

    accelerators: Annotated[str | None, BeforeValidator(lambda v: None if v is None else _accelerators(v)),
                            Field(description='one accelerator, such as "L4:2" or {L4: 2}')] = None
    cpus: _minimum("cpus") = None  # type: ignore[valid-type]
    memory: _minimum("memory") = None  # type: ignore[valid-type]
    use_spot: Flag = False
    region: Annotated[str | None, Field(min_length=1, description="a region name such as us-east-1")] = None
    instance_type: Annotated[str | None, Field(min_length=1,
                                               description="an instance type such as g6.12xlarge")] = None


def _text(description: str) -> Any:
    return Annotated[str, Field(min_length=1, description=description)]


def _no_null_map(value: Any) -> Any:
    return {} if value is None else value


class TaskFile(BaseModel):
    """A whole task file (see the module docstring for each key)."""

    model_config = STRICT

    name: Annotated[str | None, Field(description="a name for the run (a string)")] = None
    num_nodes: Count = 1
    resources: Annotated[Resources, BeforeValidator(lambda v: {} if v is None else v),
                         Field(description="a mapping: accelerators, cpus, memory, use_spot, region, "
                                           "instance_type")] = Resources()
    envs: Annotated[dict[EnvName, EnvValue], BeforeValidator(_no_null_map),
                    Field(description="a mapping of variable names to values")] = {}
    secrets: Annotated[dict[EnvName, SecretValue], BeforeValidator(_no_null_map),
                       Field(description="a mapping of variable names to values")] = {}
    workdir: Annotated[str | None, Field(min_length=1, description="a local directory (a path)")] = None
    file_mounts: Annotated[dict[Annotated[str, Field(min_length=1)], Annotated[str, Field(min_length=1)]],
                           BeforeValidator(_no_null_map),
                           Field(description="a mapping {path on the node: local path}")] = {}
    setup: Annotated[str | None, Field(description="shell code (a string) run on every node before run")] = None
    run: _text("shell code (a string) run on every node; required")  # type: ignore[valid-type]


def _in_resources(exc: ConfigError) -> ConfigError:
    """Name a problem inside ``resources:`` as ``resources.KEY``, listing that block's keys."""
    match = re.fullmatch(r"resources\['(\w+)'\]", exc.parameter)
    if match is None:
        return exc
    accepted = exc.accepted
    key = match.group(1)
    if accepted.startswith("one of "):  # an unknown key: the accepted keys are the block's own
        accepted = "one of " + ", ".join(sorted(Resources.model_fields))
    elif accepted == TaskFile.model_fields["resources"].description and key in Resources.model_fields:
        accepted = Resources.model_fields[key].description or accepted  # the key's own, not the block's
    return ConfigError(f"resources.{match.group(1)}", accepted, exc.got if exc.got != exc.parameter
                       else f"resources.{match.group(1)}", detail=exc.detail)


def load_task(path: str | os.PathLike[str]) -> TaskFile:
    """Read and validate a task file; relative ``workdir`` and ``file_mounts`` sources are taken
    from the current directory (as SkyPilot does) and must exist."""
    try:
        import yaml
    except ImportError as exc:  # an optional dependency: the worker and the library never need it
        raise SkywardError("skyward launch reads task files with PyYAML, which is not installed: "
                           "pip install 'skyward[launch]'") from exc

    where = os.fspath(path)
    try:
        text = Path(where).read_text()
    except OSError as exc:
        raise ConfigError("TASK", "a readable task file (YAML)", where, detail=str(exc)) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError("TASK", "a YAML task file", where, detail=str(exc).replace("\n", " ")) from None
    if not isinstance(data, dict):
        raise ConfigError("TASK", "a YAML mapping with at least a `run` key", where,
                          detail=f"the file holds {type(data).__name__}")
    if "run" not in data:  # (pydantic would show the whole file, secrets included, as the value)
        raise ConfigError("run", "shell code run on every node: every task file needs a `run` key",
                          "no `run` key", detail=f"in {where}")
    try:
        task = validate(TaskFile, data)
    except ConfigError as exc:
        raise _in_resources(exc) from None
    if task.workdir is not None and not Path(task.workdir).expanduser().is_dir():
        raise ConfigError("workdir", "a local directory that exists", task.workdir)
    for dest, source in task.file_mounts.items():
        if "://" in source:
            raise ConfigError(f"file_mounts[{dest!r}]", "a local path (cloud storage URIs are not supported)",
                              source)
        if not Path(source).expanduser().exists():
            raise ConfigError(f"file_mounts[{dest!r}]", "a local path that exists", source)
    return task
