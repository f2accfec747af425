"""The keys of a SkyPilot task file, checked all at once into a :class:`TaskSpec`.

Every key SkyPilot's task YAML has is accepted here; each is honoured where the provider can
(see ``docs/task-files.md``), accepted with one warning line where Skyward has nothing to do
with it (``service``, ``config``, ``pool``, ...), or refused with the reason. A key that is
not a task key at all (``runn``) is named, with the keys there are.

The result still holds ``workdir`` and ``file_mounts`` as written: they may refer to
``${VAR}`` from ``envs``, which the command line can override, so they are resolved by
:func:`skyward.launch.taskfile.mounts.resolve` once the variables are final.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from skyward.launch.taskfile.check import Findings
from skyward.launch.taskfile.fields import Autostop
from skyward.launch.taskfile.resources import Candidates, check_resources

__all__ = ["TASK_KEYS", "TaskSpec", "check_task"]

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

#: Keys a task has, and what happens to the ones Skyward accepts without acting on them.
_IGNORED = {
    "service": "ignored: skyward launch runs the task; serving replicas behind a load balancer is not "
               "something Skyward does (SkyPilot's `sky launch` ignores it too)",
    "config": "ignored: SkyPilot's per-task settings do not apply to Skyward",
    "pool": "ignored: SkyPilot's worker pools are not Skyward's; the task runs on a pool of its own",
    "event_callback": "ignored: no command is run on job events",
    "inputs": "ignored (SkyPilot's experimental data-size hint)",
    "outputs": "ignored (SkyPilot's experimental data-size hint)",
    "file_mounts_mapping": "ignored (set by SkyPilot itself, not by users)",
    "volumes": "not honoured: Skyward attaches no volumes; use file_mounts or the workdir",
    "volume_mounts": "not honoured: Skyward attaches no volumes",
    "api_server_access": "ignored: Skyward has no API server",
    "_metadata": "ignored",
}
TASK_KEYS = ("envs", "file_mounts", "managed_secrets", "name", "num_nodes", "resources", "run", "secrets",
             "setup", "workdir", *_IGNORED)


@dataclass(frozen=True)
class TaskSpec:
    """One task as written, checked (``workdir`` and ``file_mounts`` not yet resolved)."""

    run: str
    name: str | None = None
    num_nodes: int = 1
    candidates: Candidates = field(default_factory=Candidates)
    envs: Mapping[str, str | None] = field(default_factory=dict)
    secrets: Mapping[str, str | None] = field(default_factory=dict)
    workdir: str | None = None
    #: ``workdir: {url, ref}``: a git repository cloned on every node (ref: a branch, tag or commit).
    workdir_git: tuple[str, str | None] | None = None
    file_mounts: Mapping[str, Any] = field(default_factory=dict)
    setup: str | None = None

    @property
    def autostop(self) -> Autostop | None:
        """``resources.autostop``: idle minutes and ``down``, or None (not asked, or ``false``)."""
        return self.candidates.autostop


def check_task(doc: Any, found: Findings, where: str = "") -> TaskSpec | None:
    """Check one task document; every problem and warning goes to ``found``. ``where`` prefixes
    field names (``task 2: run``) in a file of several tasks."""
    at = (lambda key: f"{where}{key}")  # noqa: E731
    if not isinstance(doc, Mapping):
        found.problem(at("task"), "a YAML mapping of task keys (run, setup, resources, ...)", doc,
                      f"the document holds a {type(doc).__name__}")
        return None
    for key in doc:
        if key not in TASK_KEYS:
            found.unknown(where, key, TASK_KEYS)
    for key, text in _IGNORED.items():
        if key in doc:
            found.warn(at(key), text)
    run = doc.get("run")
    if run is None:  # SkyPilot's too: a task without run provisions its nodes and runs setup
        found.warn(at("run"), "none given: the nodes run setup (if any), then the pool ends")
        run = ""
    elif not isinstance(run, str) or not run.strip():
        found.problem(at("run"), "shell code (a string) run on every node", run)
    setup = doc.get("setup")
    if setup is not None and not isinstance(setup, str):
        found.problem(at("setup"), "shell code (a string) run on every node before run", setup)
    name = doc.get("name")
    if name is not None and not isinstance(name, (str, int)):
        found.problem(at("name"), "a name for the task (a string)", name)
    nodes = doc.get("num_nodes", 1)
    if nodes is None:
        nodes = 1
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        found.problem(at("num_nodes"), "an integer >= 1", nodes)
        nodes = 1
    envs = _variables(doc.get("envs"), at("envs"), found, secret=False)
    secrets = _variables(doc.get("secrets"), at("secrets"), found, secret=True)
    if "managed_secrets" in doc:
        found.problem(at("managed_secrets"), "secrets given in the file or with --secret NAME=VALUE",
                      doc["managed_secrets"], "secrets kept by SkyPilot's API server are out of Skyward's reach")
    workdir = doc.get("workdir")
    git = None
    if isinstance(workdir, Mapping):
        git = _git_workdir(workdir, at("workdir"), found)
        workdir = None
    elif workdir is not None and (not isinstance(workdir, str) or not workdir.strip()):
        found.problem(at("workdir"), "a local directory (a path)", workdir)
        workdir = None
    mounts = doc.get("file_mounts") or {}
    if not isinstance(mounts, Mapping):
        found.problem(at("file_mounts"), "a mapping {path on the node: source}", mounts)
        mounts = {}
    candidates = check_resources(doc.get("resources"), _Scoped(found, where))
    return TaskSpec(run=run if isinstance(run, str) else "", name=None if name is None else str(name),
                    num_nodes=nodes, candidates=candidates, envs=envs, secrets=secrets,
                    workdir=workdir, workdir_git=git, file_mounts=dict(mounts),
                    setup=setup if isinstance(setup, str) else None)


def _git_workdir(value: Mapping[str, Any], where: str, found: Findings) -> tuple[str, str | None] | None:
    for key in value:
        if key not in ("url", "ref"):
            found.unknown(f"{where}.", key, ("ref", "url"))
    url, ref = value.get("url"), value.get("ref")
    if not isinstance(url, str) or not url.strip():
        found.problem(f"{where}.url", "a git repository URL (https://..., git@..., or a path)", url)
        return None
    if ref is not None and (not isinstance(ref, str) or not ref.strip()):
        found.problem(f"{where}.ref", "a branch, tag or commit (a string)", ref)
        return None
    return url.strip(), None if ref is None else ref.strip()


def _variables(value: Any, where: str, found: Findings, *, secret: bool) -> dict[str, str | None]:
    if value is None:
        return {}
    if isinstance(value, list) and secret:
        found.problem(where, "a mapping {NAME: value}; a list names secrets kept by SkyPilot's API server, "
                      "which Skyward cannot read", value)
        return {}
    if not isinstance(value, Mapping):
        found.problem(where, "a mapping {NAME: value}", "<hidden>" if secret else value)
        return {}
    out: dict[str, str | None] = {}
    for key, raw in value.items():
        if not isinstance(key, str) or not _ENV_NAME.fullmatch(key):
            found.problem(f"{where}[{key!r}]", "a variable name (letters, digits and _, not starting with a digit)",
                          key)
            continue
        if isinstance(raw, bool):  # YAML reads `DEBUG: true` as a bool: the shell sees text
            raw = "true" if raw else "false"
        elif isinstance(raw, (int, float)):
            raw = str(raw)
        if raw is not None and not isinstance(raw, str):
            found.problem(f"{where}[{key!r}]", "a string, a number, or null (then pass it with "
                          f"{'--secret NAME' if secret else '--env NAME=VALUE'})", raw, secret=secret)
            continue
        out[key] = raw
    return out


class _Scoped(Findings):
    """Findings that prefix every field with ``task N: `` (in a file of several tasks)."""

    def __init__(self, inner: Findings, where: str):
        self.__dict__.update(inner.__dict__)  # the same lists: what is added here lands there
        self._where = where

    def problem(self, where: str, *args: Any, **kwargs: Any) -> None:
        super().problem(self._where + where, *args, **kwargs)

    def unknown(self, where: str, *args: Any) -> None:
        super().unknown(self._where + where, *args)

    def warn(self, where: str, text: str) -> None:
        super().warn(self._where + where, text)
